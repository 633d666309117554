"""The closed-form fast path must give exactly the per-request timings of stepping one iteration at a time."""

import numpy as np
import pytest

from simulator.fleet import Fleet
from simulator.run import build_workload
from simulator.scenario import load_scenario
from simulator.steptime import AffineStepModel, StepTimer, steps_reaching, sum_steps
from simulator.workload import Workload


def _scenario(**pool):
    p = {"name": "p", "latency_model": "stub", "replicas": 3, "kv_blocks": 600, "max_num_batched_tokens": 512}
    p.update(pool)
    return load_scenario(
        {
            "duration": 60,
            "seed": 3,
            "workload": {
                "arrivals": {"process": "gamma", "cv": 2.0, "rate": 6},
                "prompt_tokens": {"dist": "lognormal", "mean": 600, "median": 400, "max": 3000},
                "output_tokens": {"dist": "lognormal", "mean": 150, "median": 80, "max": 900},
            },
            "pools": [p],
            "router": {"policy": "round_robin"},
        }
    )


def _run(sc, wl, fast):
    f = Fleet(sc, wl, fast=fast, models={"stub": AffineStepModel(8.0, 0.03, 0.3, 0.002)})
    f.run()
    return f


def _assert_same(a, b):
    for name in (
        "first_sched",
        "first_token",
        "finish",
        "cached",
        "generated",
        "preemptions",
        "status",
        "replica",
    ):
        np.testing.assert_array_equal(getattr(a.requests, name), getattr(b.requests, name), err_msg=name)


def test_fast_path_equals_stepping_with_chunking_and_preemption():
    sc = _scenario()
    wl = build_workload(sc, 3)
    fast, slow = _run(sc, wl, True), _run(sc, wl, False)
    _assert_same(fast, slow)
    assert (fast.requests.status == 1).all()
    assert fast.requests.preemptions.sum() > 0  # the small KV pool forced preemptions: the hard case
    steps_fast = sum(r.metrics.v[0] for p in fast.pools for r in p.replicas)  # arrivals: same workload
    assert steps_fast == len(wl)


def test_fast_path_equals_stepping_with_shared_prefixes():
    sc = _scenario(kv_blocks=900, max_num_batched_tokens=2048)
    rng = np.random.default_rng(0)
    n = 300
    times = np.sort(rng.uniform(0, 60, n))
    groups = rng.integers(0, 5, n)  # 5 shared system prompts of 2 blocks of 512 tokens
    hashes = [[int(g) * 10, int(g) * 10 + 1, 1000 + i] for i, g in enumerate(groups)]
    wl = Workload(times, rng.integers(1100, 1500, n), rng.integers(5, 200, n), hashes)
    fast, slow = _run(sc, wl, True), _run(sc, wl, False)
    _assert_same(fast, slow)
    assert fast.requests.cached.sum() > 0
    hits = [r.bm.prefix_cache_hits for p in fast.pools for r in p.replicas]
    assert hits == [r.bm.prefix_cache_hits for p in slow.pools for r in p.replicas]


@pytest.mark.parametrize("a,b,c0,seqs", [(7, 3, 100, 4), (10**9, 12345, 5000, 17), (5, 0, 0, 1)])
def test_closed_form_sums(a, b, c0, seqs):
    total = 0
    for k in range(1, 60):
        total += a + b * (c0 + seqs * (k - 1))
        assert sum_steps(a, b, c0, seqs, k) == total
        # the step in progress at `elapsed` is the k-th one
        assert steps_reaching(a, b, c0, seqs, total) == k
        assert steps_reaching(a, b, c0, seqs, total - 1) == k
        assert steps_reaching(a, b, c0, seqs, total + 1) == k + 1


def test_step_timer_matches_model():
    m = AffineStepModel(10.0, 0.05, 0.2, 0.0005)
    t = StepTimer(m)
    for shape in ((0, 0, 4, 4000), (512, 512, 0, 0), (100, 900, 3, 1200)):
        assert t.step_ps(*shape) == pytest.approx(m.step_ms(*shape) * 1e9, abs=2)


def test_fast_path_equals_stepping_without_prefix_caching():
    sc = _scenario(prefix_caching=False, kv_blocks=500)
    wl = build_workload(sc, 3)
    fast, slow = _run(sc, wl, True), _run(sc, wl, False)
    _assert_same(fast, slow)
    assert fast.requests.preemptions.sum() > 0
