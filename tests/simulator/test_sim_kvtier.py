"""The simulator's KV offload tier (simulator.kvtier): the pool's kv_offload section and its errors, the
tiered block manager, and a fleet under KV pressure where the tier turns recomputed prefixes into
loads: higher hit rate, fewer prompt tokens computed, the copies paid in the steps."""

import numpy as np
import pytest

from engine.core.block_manager import OFFLOADED
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from simulator.fleet import Fleet
from simulator.kvtier import GIB, TieredBlockManager
from simulator.report import summarize, summary_lines
from simulator.scenario import load_scenario
from simulator.steptime import AffineStepModel
from simulator.workload import Workload

STUB = AffineStepModel(8.0, 0.03, 0.3, 0.002)


def _pool(**kw) -> dict:
    pool = {"name": "p", "latency_model": "stub", "replicas": 2, "kv_blocks": 400, "block_size": 16,
            "max_num_batched_tokens": 2048, "max_model_len": 4096, **kw}
    return {k: v for k, v in pool.items() if v is not None}


def _scenario(**kw) -> object:
    return load_scenario({"duration": 600, "seed": 1, "workload": {"arrivals": {"rate": 1},
                          "prompt_tokens": 1, "output_tokens": 1}, "pools": [_pool(**kw)],
                          "router": {"policy": "round_robin"}})


def conversations(n_conv: int = 30, turns: int = 5, gap: float = 2.0) -> Workload:
    """Multi-turn chats: each turn's prompt is the last one's blocks plus one new 512-token block."""
    rng = np.random.default_rng(7)
    rows = []
    for c in range(n_conv):
        start = rng.uniform(0, 40)
        for t in range(turns):
            rows.append((start + t * (gap * n_conv / 4 + rng.uniform(0, 1)),
                         [c * 100 + k for k in range(t + 1)]))
    rows.sort(key=lambda r: r[0])
    times = np.array([r[0] for r in rows])
    prompt = np.array([512 * len(r[1]) for r in rows])
    return Workload(times, prompt, np.full(len(rows), 8), [r[1] for r in rows])


def _run(sc, wl, fast=True) -> Fleet:
    f = Fleet(sc, wl, fast=fast, models={"stub": STUB})
    f.run()
    return f


def test_kv_offload_errors_name_the_field():
    with pytest.raises(ValueError, match=r"pools\[0\]\.kv_offload\.bandwidth_gbs: is required"):
        _scenario(kv_offload={"capacity_blocks": 10})
    with pytest.raises(ValueError, match=r"kv_offload: give one of capacity_gib, capacity_blocks"):
        _scenario(kv_offload={"bandwidth_gbs": 10})
    with pytest.raises(ValueError, match=r"pools\[0\]\.kv_offload: give only one of capacity_gib"):
        _scenario(kv_offload={"capacity_blocks": 10, "capacity_gib": 1, "bandwidth_gbs": 10})
    with pytest.raises(ValueError, match=r"pools\[0\]\.kv_offload\.bandwidth_gbs: must be > 0"):
        _scenario(kv_offload={"capacity_blocks": 10, "bandwidth_gbs": 0})
    with pytest.raises(ValueError, match=r"pools\[0\]\.kv_offload: needs prefix_caching"):
        _scenario(prefix_caching=False, kv_offload={"capacity_blocks": 10, "bandwidth_gbs": 10,
                                                    "kv_bytes_per_token": 1000})
    with pytest.raises(ValueError, match=r"pools\[0\]\.kv_offload\.kv_bytes_per_token: is required"):
        _scenario(kv_offload={"capacity_gib": 1, "bandwidth_gbs": 10})
    with pytest.raises(ValueError, match=r"kv_offload\.capacity_gib: holds no whole block"):
        _scenario(kv_offload={"capacity_gib": 1e-9, "bandwidth_gbs": 10, "kv_bytes_per_token": 1000})
    with pytest.raises(ValueError, match=r"kv_offload\.capacity_gib: gives \d+ blocks"):
        _scenario(kv_offload={"capacity_gib": 1e5, "bandwidth_gbs": 10, "kv_bytes_per_token": 1000})


def test_kv_offload_capacity_price_and_copy_time_from_the_pool():
    km = {"gpu_memory_gib": 80, "weights_gib": 40, "kv_bytes_per_token": 327680}
    sc = _scenario(kv_blocks=None, kv_memory=km, cost_per_hour=10.0,
                   kv_offload={"capacity_gib": 256, "bandwidth_gbs": 50, "price_per_gib_hour": 0.01})
    spec = sc.pools[0].kv_offload
    assert spec.blocks == 256 * GIB // (16 * 327680)
    assert spec.kv_bytes_per_token == 327680
    assert sc.pools[0].cost_per_hour == pytest.approx(10.0 + spec.capacity_gib * 0.01)
    assert spec.load_ps_per_block / 1e12 == pytest.approx(16 * 327680 / 50e9)  # 105 us a block


def _seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams(max_tokens=1))


def test_tiered_block_manager_keeps_evicted_blocks_and_loads_them_back():
    bm = TieredBlockManager(4, 4, offload_blocks=3)
    a = _seq(list(range(13)))  # 3 full blocks + 1 token
    blocks, hashes = bm.lookup_prefix(a)
    assert blocks == []
    bm.admit(a, blocks, hashes)
    assert bm.append_slots(a, 13)
    a.num_computed_tokens = 13
    bm.cache_full_blocks(a)
    bm.free(a)
    b = _seq([100 + i for i in range(16)])  # takes all 4 blocks: a's 3 cached ones go to the tier
    bm.admit(b, [], [])
    assert bm.append_slots(b, 16)
    assert not bm.cached and len(bm.offload) == 3
    bm.free(b)
    again = _seq(list(range(13)))
    blocks, hashes = bm.lookup_prefix(again)
    assert blocks == [OFFLOADED] * 3 and bm.can_admit(again, blocks, 1)
    bm.admit(again, blocks, hashes)
    assert again.num_computed_tokens == 12 and bm.offload_hits == 12 and bm.prefix_cache_hits == 0
    assert bm.offload.take_loaded() == 3 and bm.offload.take_loaded() == 0 and not bm.offload.pins
    assert all(bm.cached[h] == b for h, b in zip(hashes, again.block_table))  # on device again
    assert len(bm.offload) == 3  # b's evicted blocks (capacity 3: the LRU kept the newest)


def test_offload_tier_turns_recompute_into_loads_under_kv_pressure():
    wl = conversations()
    off = {"capacity_blocks": 20_000, "bandwidth_gbs": 50, "kv_bytes_per_token": 1000}
    base = summarize(_run(_scenario(), wl))["pools"]["p"]["kv_tiers"]
    tier = summarize(_run(_scenario(kv_offload=off), wl))["pools"]["p"]["kv_tiers"]
    assert base["offload_hit_tokens"] == 0 and "offload" not in base
    # each turn re-sends its conversation's earlier blocks: evicted from 400 device blocks, kept in the tier
    assert tier["hit_rate"] > base["hit_rate"] + 0.2
    assert tier["offload_hit_rate"] > 0.2
    assert tier["prefill_tokens_computed"] < base["prefill_tokens_computed"]
    for t in (base, tier):  # every looked-up token was found in a tier or computed (no preemption here)
        assert t["prefill_tokens_computed"] == t["queried_tokens"] - t["device_hit_tokens"] - t[
            "offload_hit_tokens"]
    assert tier["offload"]["stored_blocks"] > 0
    lines = summary_lines(summarize(_run(_scenario(kv_offload=off), wl)))
    line = [x for x in lines if x.startswith("KV tiers")]
    assert line == [f"KV tiers (p): {tier['hit_rate']:.1%} of prompt tokens looked up found (device "
                    f"{tier['device_hit_rate']:.1%}, offload tier {tier['offload_hit_rate']:.1%}), "
                    f"{tier['prefill_tokens_computed']:,} computed; tier 0.3 GiB a replica, 0.000 ms to load "
                    "a block"]


def test_offload_copies_are_paid_in_the_step():
    wl = conversations(n_conv=10, turns=3)
    off = {"capacity_blocks": 20_000, "kv_bytes_per_token": 1000}
    fast = _run(_scenario(kv_blocks=120, kv_offload={**off, "bandwidth_gbs": 1000}), wl)
    slow = _run(_scenario(kv_blocks=120, kv_offload={**off, "bandwidth_gbs": 1e-5}), wl)  # 1.6 s a block
    assert summarize(fast)["pools"]["p"]["kv_tiers"]["offload_hit_tokens"] > 0
    late = (slow.requests.first_token - fast.requests.first_token) / 1e12
    assert late.max() > 1.6  # at least one block's copy at 10 kB/s
    assert summarize(slow)["pools"]["p"]["kv_tiers"]["offload"]["load_ms_per_block"] == pytest.approx(1600)


def test_fast_path_equals_stepping_with_an_offload_tier():
    wl = conversations(n_conv=12, turns=4)
    sc = _scenario(kv_blocks=160, kv_offload={"capacity_blocks": 300, "bandwidth_gbs": 5,
                                               "kv_bytes_per_token": 1000})
    a, b = _run(sc, wl, True), _run(sc, wl, False)
    for name in ("first_sched", "first_token", "finish", "cached", "preemptions", "status", "replica"):
        np.testing.assert_array_equal(getattr(a.requests, name), getattr(b.requests, name), err_msg=name)
    assert sum(r.bm.offload_hits for r in a.pools[0].replicas) > 0


def test_plan_prices_the_offload_tier_per_replica():
    from simulator.planner.plan import load_plan

    km = {"gpu_memory_gib": 74.5, "weights_gib": 130.4, "kv_bytes_per_token": 327680}
    dep = {"name": "h100", "latency_model": "h100-llama2-70b-tp4", "price_per_gpu_hour": 3.0, "kv_memory": km}
    plan = {"duration": 600, "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 100, "output_tokens": 10},
            "slo": {"ttft": 2.0},
            "deployments": [dep, {**dep, "name": "h100-host", "kv_offload": {
                "capacity_gib": 256, "bandwidth_gbs": 100, "price_per_gib_hour": 0.005}}]}
    plain, tier = (c.deployment for c in load_plan(plan).candidates)
    assert plain.cost_per_hour == 12.0 and plain.offload_cost_per_hour == 0.0
    assert tier.offload_cost_per_hour == pytest.approx(256 * 0.005, rel=1e-4)
    assert tier.cost_per_hour == pytest.approx(12.0 + 1.28, rel=1e-4)
    sc = load_scenario({"duration": 10, "workload": plan["workload"], "pools": [
        load_plan(plan).candidates[1].pool(2)]})
    assert sc.pools[0].cost_per_hour == pytest.approx(tier.cost_per_hour)  # priced once, not twice
    bad = {**plan, "deployments": [{**dep, "prefix_caching": False, "kv_offload": {
        "capacity_gib": 256, "bandwidth_gbs": 100}}]}
    with pytest.raises(ValueError, match=r"deployments\[0\]\.kv_offload: as a scenario pool: .*prefix_"):
        load_plan(bad)


def test_example_plan_prices_the_tier():
    from pathlib import Path

    from simulator.planner.plan import load_plan

    path = Path(__file__).resolve().parents[2] / "examples" / "plan_kvtier_70b.yaml"
    if not (path.parent.parent.parent / "shared" / "data" / "traces").is_dir():
        pytest.skip("the Mooncake trace (../shared/data) is not here")
    plain, tier = (c.deployment for c in load_plan(path).candidates)
    assert tier.offload_cost_per_hour == pytest.approx(256 * 0.005, rel=1e-4)
    assert tier.cost_per_hour - plain.cost_per_hour == pytest.approx(1.28, rel=1e-4)
