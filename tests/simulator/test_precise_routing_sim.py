"""The precise prefix scorer in the simulator: its index is fed by the replicas' own block managers
(device and offload tier), so it equals their caches, and under KV pressure on the Mooncake trace it
routes at least as well as the approximate scorer."""

from __future__ import annotations

import pytest

from simulator.fleet import Fleet
from simulator.report import summarize
from simulator.run import build_workload
from simulator.scenario import load_scenario
from simulator.steptime import AffineStepModel

MODEL = AffineStepModel(10.0, 0.01, 0.3, 0.0002)


def run(shared_data, weights: dict, limit: int = 300, kv_blocks: int = 9000) -> Fleet:
    sc = load_scenario({"seed": 5, "workload": {"trace": {
        "format": "mooncake", "path": str(shared_data / "traces" / "mooncake_conversation.jsonl"),
        "limit": limit}},
        "pools": [{"name": "p", "latency_model": "stub", "replicas": 4, "kv_blocks": kv_blocks,
                   "max_model_len": 131072}],
        "router": {"policy": "weighted", "weights": weights}})
    fleet = Fleet(sc, build_workload(sc, 5), models={"stub": MODEL})
    fleet.run()
    return fleet


def test_index_is_the_replicas_caches(shared_data):
    fleet = run(shared_data, {"queue": 1.0, "kv": 1.0, "precise_prefix": 4.0}, limit=80, kv_blocks=6000)
    index = fleet.router.kv_index
    assert index is not None and fleet.router.block_tokens == 16
    for r in fleet.ready:
        held = {k for k, m in index._eps[r.id].media.items() if "GPU" in m} if r.id in index._eps else set()
        assert held == set(r.bm.cached)
    assert sum(len(r.bm.cached) for r in fleet.ready) > 1000


@pytest.mark.slow  # about a minute on a loaded machine
def test_precise_routes_no_worse_than_approximate_under_kv_pressure(shared_data):
    precise = run(shared_data, {"queue": 1.0, "kv": 1.0, "precise_prefix": 4.0})
    index = precise.router.kv_index
    assert index is not None and precise.router.block_tokens == 16
    reps = [r for r in precise.ready]
    assert len(reps) == 4
    for r in reps:
        held = {k for k, m in index._eps[r.id].media.items() if "GPU" in m} if r.id in index._eps else set()
        assert held == set(r.bm.cached)
    assert sum(len(r.bm.cached) for r in reps) > 1000
    approx = run(shared_data, {"queue": 1.0, "kv": 1.0, "prefix": 4.0})
    p, a = (summarize(f)["pools"]["p"]["prefix_cache_hit_rate"] for f in (precise, approx))
    print(f"prefix-cache hit rate, 300 Mooncake requests, 4 replicas of 9000 blocks: precise {p:.1%}, "
          f"approximate {a:.1%}")
    assert p >= 0.97 * a
