"""A priority band's own saturation level (routing.flow.Band.saturation): a batch band held at a
lower level waits in the gateway while the interactive band still dispatches, in the simulator's
flow control and in the live router's gate (the same `pump`)."""

import asyncio
from dataclasses import dataclass

import pytest

from controlplane.router.gate import Gate, Pending
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pool import Pool
from routing.config import load_router_config
from routing.flow import Band, GatewayQueue, SaturationDetector, pump
from simulator.scenario import load_scenario

INTERACTIVE, BATCH = 10, 0
DETECTOR = SaturationDetector(queue_threshold=4, kv_threshold=0.8)

# (waiting, kv usage of the one replica, batch band's level) -> (interactive goes, batch goes);
# utilization = max(waiting / 4, kv / 0.8)
CASES = [
    (0, 0.00, 0.5, True, True),  # idle: both go
    (1, 0.30, 0.5, True, True),  # utilization 0.375 < 0.5
    (2, 0.10, 0.5, True, False),  # waiting at half the queue threshold: batch held
    (0, 0.40, 0.5, True, False),  # KV at half its threshold: batch held
    (3, 0.70, 0.5, True, False),  # 0.875: only interactive
    (4, 0.10, 0.5, False, False),  # saturated: both held
    (0, 0.79, 1.0, True, True),  # a band at 1.0 is the detector's rule
    (0, 0.05, 0.1, True, True),  # 0.0625 < 0.1
    (0, 0.09, 0.1, True, False),  # 0.1125: held at the batch level
]


@dataclass
class R:
    id: int
    num_waiting: int = 0
    kv_usage: float = 0.0


def _queue(level: float) -> GatewayQueue:
    q = GatewayQueue([Band(INTERACTIVE, name="interactive"), Band(BATCH, name="batch", saturation=level)])
    q.offer("batch", BATCH, 0.0)  # the older one: arrival order alone would send it first
    q.offer("interactive", INTERACTIVE, 0.0)
    return q


@pytest.mark.parametrize("waiting,kv,level,inter_goes,batch_goes", CASES)
def test_simulator_pump_holds_batch_at_its_level(waiting, kv, level, inter_goes, batch_goes):
    q = _queue(level)
    sent = []
    # dispatch leaves the replica's view as it was: the case's utilization holds for both
    pump(q, DETECTOR, [R(0, waiting, kv)], lambda h, room: sent.append(h.item), now=1.0)
    assert ("interactive" in sent) is inter_goes
    assert ("batch" in sent) is batch_goes
    assert sent == [x for x in ("interactive", "batch") if x in sent]  # band order kept
    assert len(q) == 2 - len(sent)


def test_batch_uses_only_the_replicas_under_its_level():
    q = GatewayQueue([Band(INTERACTIVE), Band(BATCH, saturation=0.5)])
    for i in range(3):
        q.offer(f"b{i}", BATCH, 0.0)
    reps = [R(0, 3, 0.1), R(1, 0, 0.1)]  # 0: utilization 0.75 (interactive only); 1: 0.125
    sent = []

    def dispatch(held, room):
        r = room[0]
        r.num_waiting += 1
        sent.append((held.item, [x.id for x in room]))

    pump(q, DETECTOR, reps, dispatch, now=0.0)
    # replica 1 takes batch until it reaches half the queue threshold (2 waiting); the third is held
    assert sent == [("b0", [1]), ("b1", [1])] and len(q) == 1


def _gate(level: float, tmp_path) -> tuple[Gate, Pool]:
    cfg_file = tmp_path / "router.yaml"
    cfg_file.write_text(
        "kind: EndpointPickerConfig\n"
        "saturationDetector: {queueDepthThreshold: 4, kvCacheUtilThreshold: 0.8}\n"
        "flowControl:\n"
        "  priorityBands:\n"
        f"  - {{priority: {INTERACTIVE}, name: interactive, ttl: 30s}}\n"
        f"  - {{priority: {BATCH}, name: batch, ttl: 1h, saturation: {level}}}\n"
    )
    cfg = load_router_config(str(cfg_file))
    metrics = RouterMetrics()
    pool = Pool(cfg, lambda: [], metrics, clock=lambda: 0.0)
    pool.sync(["http://e0:8000"])
    return Gate(cfg, pool, metrics, clock=lambda: 0.0), pool


@pytest.mark.parametrize("waiting,kv,level,inter_goes,batch_goes", CASES)
def test_live_gate_holds_batch_at_its_level(waiting, kv, level, inter_goes, batch_goes, tmp_path):
    async def main():
        gate, pool = _gate(level, tmp_path)
        ep = next(iter(pool.endpoints.values()))
        ep.scraped_waiting, ep.kv_usage = waiting, kv
        sent = []
        real_take = gate.take

        def take(e, p):  # what the case set stays the endpoint's view (as between two scrapes)
            real_take(e, p)
            e.outstanding_at_scrape = e.outstanding
            e.num_running = e.outstanding
            sent.append(p.priority)

        gate.take = take
        tasks = {}
        for prio in (BATCH, INTERACTIVE):
            p = Pending([], 10, None, prio, "", 0.0)
            tasks[prio] = asyncio.ensure_future(gate.acquire(p))
            await asyncio.sleep(0)
        assert (INTERACTIVE in sent) is inter_goes
        assert (BATCH in sent) is batch_goes
        assert gate.queue.sizes() == {"interactive": int(not inter_goes), "batch": int(not batch_goes)}
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)

    asyncio.run(main())


def test_band_saturation_in_the_configs():
    sc = load_scenario({
        "duration": 10, "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 10, "output_tokens": 10},
        "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4", "replicas": 1}],
        "router": {"flow_control": {"bands": [{"priority": 1}, {"priority": 0, "saturation": 0.25}]}},
    })
    assert [b.saturation for b in sc.router.config.bands] == [1.0, 0.25]
    with pytest.raises(ValueError):
        Band(0, saturation=0.0)
