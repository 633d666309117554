"""The engine's offload tier: its LRU book, capacity, hit accounting, the block manager's hooks, the
copies (bit-exact), the emulated engine's copy time, /metrics, and bad flag values."""

from __future__ import annotations

import argparse
import math

import pytest

from engine.args import EngineArgs
from engine.core.block_manager import OFFLOADED, BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.kv_offload import OffloadIndex, OffloadTier, TimedCopier, num_slots

# -- the LRU book ----------------------------------------------------------------------------


def test_lru_evicts_least_recently_used_and_reports_moves():
    idx = OffloadIndex(3)
    events = []
    idx.on_stored.append(lambda hs, m: events.append(("stored", hs, m)))
    idx.on_removed.append(lambda hs, m: events.append(("removed", hs, m)))
    assert [h for h, _ in idx.insert([10, 11, 12])] == [10, 11, 12]
    idx.touch(10)  # 11 is now the least recently used
    assert [h for h, _ in idx.insert([13])] == [13]
    assert idx.hashes() == [12, 10, 13] and 11 not in idx
    assert idx.insert([12]) == [] and idx.hashes() == [10, 13, 12]  # stored already: only touched
    assert idx.evictions == 1 and len(idx) == 3 and idx.usage == 1.0
    assert events == [("stored", [10, 11, 12], "CPU"), ("removed", [11], "CPU"), ("stored", [13], "CPU")]
    assert idx.check() == []


def test_lru_pins_hold_entries_and_a_full_pinned_tier_skips_stores():
    idx = OffloadIndex(2)
    idx.insert([1, 2])
    idx.pin([1, 2])
    assert idx.insert([3]) == [] and idx.stores_skipped == 1 and idx.hashes() == [1, 2]
    assert "still pinned" in idx.check()[0]
    idx.unpin([1])
    assert [h for h, _ in idx.insert([3])] == [3] and 1 not in idx and 2 in idx
    idx.unpin([2])
    assert idx.check() == []
    with pytest.raises(ValueError, match="not pinned"):
        idx.unpin([2])
    with pytest.raises(KeyError, match="not in the offload tier"):
        idx.pin([99])
    idx.clear()
    assert len(idx) == 0 and idx.check() == []


# -- the block manager with a tier (no tensors: a timed copier) -----------------------------

def tiered_bm(device_blocks: int = 4, slots: int = 3, block_size: int = 4):
    bm = BlockManager(device_blocks, block_size)
    bm.offload = OffloadTier(slots, 1000, TimedCopier(1.0, 1000))  # 1 us per block
    return bm


def run_to_end(sched: Scheduler, seq: Sequence) -> None:
    sched.add(seq)
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update(out, [7 if s.num_computed_tokens + n == len(s) else None
                           for s, n in zip(out.seqs, out.num_new_tokens)])


def test_evicted_blocks_go_to_the_tier_and_come_back_on_a_hit():
    bm = tiered_bm()
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=64)
    a = list(range(100, 109))  # 9 tokens: 2 full blocks cached, 1 token always recomputed
    run_to_end(sched, Sequence(a, SamplingParams(max_tokens=1), "a"))
    assert len(bm.cached) == 2 and len(bm.offload.index) == 0
    run_to_end(sched, Sequence(list(range(200, 215)), SamplingParams(max_tokens=1), "b"))  # 4 blocks
    assert len(bm.offload.index) == 2 and bm.offload.stored_blocks == 2  # a's blocks, evicted, kept
    again = Sequence(a, SamplingParams(max_tokens=1), "a2")
    blocks, hashes = bm.lookup_prefix(again)
    assert blocks == [OFFLOADED, OFFLOADED] and all(h in bm.offload for h in hashes)
    run_to_end(sched, again)
    assert again.num_cached_tokens == 8 and bm.offload.loaded_blocks == 2
    assert bm.offload_hits == 8 and bm.offload_queries == 9 + 15 + 9  # every token the device missed
    assert bm.prefix_cache_hits == 0 and bm.prefix_cache_queries == 9 * 2 + 15
    assert bm.offload.copier.pending_s == pytest.approx(2 * 1000 / 1e9)  # loads only, 1 GB/s
    # restored blocks are device-cached again: the next lookup hits the device, not the tier
    assert all(b != OFFLOADED for b in bm.lookup_prefix(Sequence(a))[0])
    assert bm.check_no_leak() == []


def test_a_finished_request_leaves_both_books_clean_and_capacity_holds():
    bm = tiered_bm(device_blocks=6, slots=5)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=8)  # chunked, two at a time
    prompts = [[base + i for i in range(13)] for base in range(0, 300, 100)]  # 9 full blocks
    for rnd in range(3):
        for i, p in enumerate(prompts):
            sched.add(Sequence(p, SamplingParams(max_tokens=2), f"{rnd}-{i}"))
        aborted = False
        while sched.has_unfinished():
            out = sched.schedule()
            if not aborted and rnd == 1 and out.seqs:  # one aborted mid-prefill
                aborted = sched.abort(out.seqs[0].request_id)
            sched.update(out, [7 if s.num_computed_tokens + n == len(s) else None
                               for s, n in zip(out.seqs, out.num_new_tokens)])
        assert bm.check_no_leak() == []  # device refcounts all zero, tier slots and pins consistent
        assert len(bm.offload.index) <= 5
    assert bm.offload.index.evictions > 0 and bm.offload_hits > 0
    assert bm.offload_hits == bm.offload.loaded_blocks * bm.block_size
    # every hit counted once: device + tier hits never exceed what was looked up
    assert bm.prefix_cache_hits + bm.offload_hits <= bm.prefix_cache_queries


def test_listener_sees_blocks_enter_and_leave_the_tier():
    bm = tiered_bm(device_blocks=4, slots=2)
    seen = {"stored": [], "removed": []}
    bm.offload.add_listener(lambda hs, m: seen["stored"].extend((h, m) for h in hs),
                            lambda hs, m: seen["removed"].extend((h, m) for h in hs))
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=64)
    for base in (0, 100, 200):
        run_to_end(sched, Sequence([base + i for i in range(15)], SamplingParams(max_tokens=1)))
    assert {m for _, m in seen["stored"] + seen["removed"]} == {"CPU"}
    held = {h for h, _ in seen["stored"]} - {h for h, _ in seen["removed"]}
    assert held == set(bm.offload.index.hashes()) and len(held) == 2


# -- copies on the CPU engine are bit-exact; the emulated engine charges their time -----------

def test_restored_block_is_bit_identical_on_the_cpu_engine():
    import torch

    from engine.llm_engine import LLMEngine

    eng = LLMEngine(EngineArgs(model="tiny", num_kv_blocks=6, max_num_seqs=1, kv_offloading_size=1e-4))
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prompt = list(range(300, 333))  # 2 full blocks + 1
    eng.add_request(prompt, params, "a")
    while eng.has_unfinished():
        eng.step()
    bm, kv = eng.block_manager, eng.runner.kv_caches
    hashes = list(bm.cached)[:2]
    before = [torch.stack([kv[l][j][bm.cached[h]] for l in range(len(kv)) for j in (0, 1)]) for h in hashes]
    eng.add_request(list(range(400, 495)), params, "b")  # the whole pool: evicts all of a's
    while eng.has_unfinished():
        eng.step()
    assert all(h not in bm.cached and h in bm.offload for h in hashes)
    eng.add_request(prompt + [5], params, "a2")
    while eng.has_unfinished():
        eng.step()
    assert eng.seqs["a2"].num_cached_tokens == 32 and bm.offload.loaded_blocks == 2
    after = [torch.stack([kv[l][j][bm.cached[h]] for l in range(len(kv)) for j in (0, 1)]) for h in hashes]
    assert all(torch.equal(x, y) for x, y in zip(before, after))
    assert bm.offload.load_seconds > 0 and bm.check_no_leak() == []


def test_emulated_step_pays_for_the_blocks_it_loads():
    from engine.emulated import EmulatedRunner, VirtualClock
    from engine.llm_engine import LLMEngine

    class Flat:  # 1 ms a step, whatever its shape
        def step_ms(self, *shape) -> float:
            return 1.0

    def total(prompts, offload):
        clock = VirtualClock()
        runner = EmulatedRunner(Flat(), num_kv_blocks=8, block_size=16, sleep=clock.sleep, clock=clock,
                                kv_bytes_per_token=1e6, offload_bandwidth_gbs=16.0)  # 1 ms a block
        args = EngineArgs("emu", max_num_seqs=1, kv_offloading_size=offload)
        eng = LLMEngine(args, runner=runner, clock=clock)
        steps = 0
        for i, p in enumerate(prompts):
            eng.add_request(p, SamplingParams(max_tokens=1), str(i))
            while eng.has_unfinished():
                steps += bool(eng.step())
        return clock.now, steps, eng.block_manager

    a, b = [1000 + i for i in range(65)], [3000 + i for i in range(127)]  # b fills the pool
    with pytest.raises(ValueError, match="smaller than one KV block"):
        total([a], 0.01)  # 16 MB a block > 0.01 GiB
    seconds, steps, bm = total([a, b, a], 1.0)
    assert bm.offload.loaded_blocks == 4  # a's 4 full blocks came back
    assert seconds == pytest.approx(steps * 1e-3 + 4 * 1e-3)  # 4 blocks x 16 MB / 16 GB/s


# -- flags -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(kv_offloading_size=0), "positive number of GiB"),
    (dict(kv_offloading_size=-2), "positive number of GiB"),
    (dict(kv_offloading_size=math.nan), "positive number of GiB"),
    (dict(kv_offloading_size=math.inf), "positive number of GiB"),
    (dict(kv_offloading_size=1, kv_offloading_backend="lmcache"), "LMCache server"),
    (dict(kv_offloading_size=1, kv_offloading_backend="nope"), "must be one of native"),
    (dict(kv_offloading_size=1, enable_prefix_caching=False), "needs prefix caching"),
    (dict(kv_offloading_bandwidth=0), "--kv-offloading-bandwidth"),
])
def test_bad_offload_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs)


def test_size_below_one_block_and_cli_flags():
    with pytest.raises(ValueError, match=r"smaller than one KV block \(8192 bytes\)"):
        num_slots(1e-9, 8192)
    assert num_slots(1.0, 8192) == 131072

    from slopilot.commands import serve as cli_serve

    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    ns = parser.parse_args(["tiny", "--kv-offloading-size", "2.5", "--kv-offloading-backend", "native"])
    assert (ns.kv_offloading_size, ns.kv_offloading_backend) == (2.5, "native")
    with pytest.raises(ValueError, match="--kv-offloading-size must be"):
        cli_serve.run(parser.parse_args(["tiny", "--kv-offloading-size", "-1"]))
    with pytest.raises(SystemExit):  # argparse: "invalid float value"
        parser.parse_args(["tiny", "--kv-offloading-size", "lots"])


def test_metrics_name_tier_hits_as_vllm_does():
    from prometheus_client.parser import text_string_to_metric_families

    from engine.emulated import EmulatedRunner, VirtualClock
    from engine.llm_engine import LLMEngine
    from engine.metrics import EngineMetrics

    class Flat:
        def step_ms(self, *shape) -> float:
            return 1.0

    clock = VirtualClock()
    runner = EmulatedRunner(Flat(), num_kv_blocks=8, block_size=16, sleep=clock.sleep, clock=clock,
                            kv_bytes_per_token=64)
    eng = LLMEngine(EngineArgs("emu", max_num_seqs=1, kv_offloading_size=1e-3), runner=runner, clock=clock)
    metrics = EngineMetrics("emu", 1024, offload=True)
    for i, p in enumerate([list(range(1000, 1065)), list(range(3000, 3127)), list(range(1000, 1065))]):
        eng.add_request(p, SamplingParams(max_tokens=1), str(i))
        while eng.has_unfinished():
            eng.step()
        metrics.update_gauges(eng)
    values = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
              for s in f.samples}
    bm = eng.block_manager
    assert values["vllm:external_prefix_cache_hits_total"] == bm.offload_hits == 64
    assert values["vllm:external_prefix_cache_queries_total"] == bm.offload_queries
    assert values["vllm:prefix_cache_hits_total"] == bm.prefix_cache_hits
    assert values["vllm:kv_offload_load_bytes_total"] == 4 * 16 * 64
    assert values["vllm:kv_offload_store_bytes_total"] == bm.offload.stored_blocks * 16 * 64 > 0
    plain = EngineMetrics("emu", 1024).render().decode()
    assert "external_prefix_cache" not in plain and "kv_offload" not in plain


def test_a_fleet_file_passes_the_offload_flags_to_its_replicas():
    from controlplane.fleet.config import load_fleet_config
    from slopilot.commands.fleet import serve_flags

    cfg = load_fleet_config({"name": "x", "emulate": "llama-3.1-70b@h100-sxm-tp4-bf16", "replicas": 1,
                             "max_replicas": 1,
                             "engine": {"kv_offloading_size": 256, "kv_offloading_bandwidth": 256}},
                            engine_flags=serve_flags())
    args = cfg.serve_args(9000)
    assert args[args.index("--kv-offloading-size") + 1] == "256"
    assert args[args.index("--kv-offloading-bandwidth") + 1] == "256"


def test_admit_without_room_for_restored_blocks_refuses_and_leaks_nothing():
    bm = tiered_bm(device_blocks=4, slots=4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    a = list(range(100, 109))
    run_to_end(sched, Sequence(a, SamplingParams(max_tokens=1), "a"))
    run_to_end(sched, Sequence(list(range(200, 215)), SamplingParams(max_tokens=1), "b"))
    hold = Sequence(list(range(300, 315)), SamplingParams(max_tokens=1), "hold")
    bm.admit(hold, [], [])
    assert bm.append_slots(hold, 15)  # every block referenced: none left for a's restore
    again = Sequence(a)
    blocks, hashes = bm.lookup_prefix(again)
    assert OFFLOADED in blocks and not bm.can_admit(again, blocks, 1)
    with pytest.raises(RuntimeError, match="call can_admit first"):
        bm.admit(again, blocks, hashes)
    bm.free(hold)
    assert bm.check_no_leak() == []  # no share kept, no pin left
