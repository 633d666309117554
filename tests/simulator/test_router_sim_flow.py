"""The simulator's router with the shared gateway queue (router.flow_control): the same policy
compared with and without flow control on one overloaded pool."""

import numpy as np
import pytest

from simulator.requests import OK, REJECTED
from simulator.run import simulate
from simulator.scenario import load_scenario


def scenario(flow: dict | None) -> dict:
    router = {"policy": "least_outstanding", **({"flow_control": flow} if flow else {})}
    return {
        "name": "overload", "seed": 1, "duration": 60,
        "workload": {"arrivals": {"rate": 12}, "prompt_tokens": 512, "output_tokens": 128},
        "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4", "replicas": 2, "max_num_seqs": 16,
                   "kv_blocks": 4096, "autoscaler": {"fixed": 2}}],
        "router": router, "drain": {"enabled": True, "max": 600},
    }


FLOW = {"queue_threshold": 2, "bands": [
    {"priority": 10, "name": "high", "share": 0.2, "capacity": 1000, "ttl": 600},
    {"priority": 0, "name": "low", "share": 0.8, "capacity": 60, "ttl": 600}]}


def run(flow, tmp_path):
    res = simulate(load_scenario(scenario(flow)), tmp_path, plots=False)
    return res.fleet


def test_flow_control_holds_requests_at_the_gateway(tmp_path, monkeypatch):
    seen = []
    import simulator.fleet as fleet_mod

    real_send = fleet_mod.Fleet.send

    def send(self, seq, candidates):  # the replicas' waiting queues at each dispatch
        real_send(self, seq, candidates)
        seen.append(max(r.num_waiting for r in self.ready))

    monkeypatch.setattr(fleet_mod.Fleet, "send", send)
    with_flow = run(FLOW, tmp_path / "flow")
    assert max(seen) <= FLOW["queue_threshold"]
    seen.clear()
    without = run(None, tmp_path / "plain")
    assert max(seen) > 20  # without a gateway queue the engines queue everything

    log = with_flow.requests
    ttft = (log.first_token - with_flow.arrival_ps) / 1e12
    ok = log.status == OK
    # the low band (capacity 60) overflows and is refused; the rest is served
    assert with_flow.gate.refused > 0 and (log.status == REJECTED).sum() == with_flow.gate.refused
    assert ok.sum() + with_flow.gate.refused == len(log.status)
    assert set(with_flow.gate.band[log.status == REJECTED].tolist()) == {0}
    high = float(np.percentile(ttft[ok & (with_flow.gate.band == 10)], 90))
    low = float(np.percentile(ttft[ok & (with_flow.gate.band == 0)], 90))
    plain = float(np.percentile((without.requests.first_token - without.arrival_ps) / 1e12, 90))
    print(f"TTFT p90: high band {high:.2f}s, low band {low:.2f}s, without flow control {plain:.2f}s")
    assert 3 * high < low and high < plain  # the high band skips the queue the low band waits in
    assert (without.requests.status == OK).all()


def test_bad_flow_control_is_named():
    bad = scenario({"bands": [{"priority": 1}, {"priority": 1}]})
    with pytest.raises(ValueError, match="priorities must be distinct"):
        load_scenario(bad)
    bad = scenario({"queue_threshold": 0})
    with pytest.raises(ValueError, match="router.flow_control.queue_threshold"):
        load_scenario(bad)
