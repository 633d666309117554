"""Sanity of the fleet simulator: low-load latencies equal the model's predictions, Little's law,
every request ends once, KV never over capacity, prefix-affinity beats round-robin on Mooncake."""

import numpy as np
import pytest

from simulator.dists import parse_dist
from simulator.fleet import Fleet
from simulator.report import summarize
from simulator.run import build_workload, simulate
from simulator.scenario import FailureSpec, load_scenario
from simulator.steptime import AffineStepModel

MODEL = AffineStepModel(base_ms=12.0, prefill_token_ms=0.04, decode_seq_ms=0.5, decode_kv_ms=0.001)


def _sc(rate, duration, replicas=1, prompt=500, output=50, **extra):
    d = {
        "duration": duration,
        "seed": 11,
        "workload": {"arrivals": {"rate": rate}, "prompt_tokens": prompt, "output_tokens": output},
        "pools": [{"name": "p", "latency_model": "stub", "replicas": replicas, "kv_blocks": 3000}],
        "output": {"timeline_interval": 1.0},
    }
    d.update(extra)
    return load_scenario(d)


def test_low_load_latency_equals_predicted_steps():
    sc = _sc(rate=0.05, duration=2000)
    res = simulate(sc, models={"stub": MODEL}, plots=False)
    f = res.fleet
    arrival = f.arrival_ps / 1e12
    finish = f.requests.finish / 1e12
    alone = [
        i
        for i in range(len(arrival))
        if (i == 0 or finish[i - 1] < arrival[i]) and (i + 1 == len(arrival) or finish[i] < arrival[i + 1])
    ]
    assert len(alone) > 50
    prefill = MODEL.step_ms(500, 500, 0, 0) / 1000
    decode = np.mean([MODEL.step_ms(0, 0, 1, 501 + j) for j in range(49)]) / 1000
    ttft = (f.requests.first_token[alone] - f.arrival_ps[alone]) / 1e12
    tpot = (f.requests.finish[alone] - f.requests.first_token[alone]) / 1e12 / 49
    np.testing.assert_allclose(ttft, prefill, rtol=1e-9)
    np.testing.assert_allclose(tpot, decode, rtol=1e-9)


def test_littles_law_ends_once_and_kv_within_capacity():
    sc = _sc(
        rate=3,
        duration=400,
        replicas=2,
        prompt={"dist": "lognormal", "mean": 800, "median": 600, "max": 4000},
        output={"dist": "lognormal", "mean": 200, "median": 120, "max": 1500},
    )
    wl = build_workload(sc, 11)
    fleet = Fleet(sc, wl, models={"stub": MODEL})
    ends = []
    orig = fleet.on_finish
    fleet.on_finish = lambda rep, seq: (ends.append(seq.index), orig(rep, seq))
    fleet.run()
    s = summarize(fleet)
    assert sorted(ends) == list(range(len(wl)))  # every request ends, exactly once
    assert s["requests"]["ok"] == len(wl)
    ll = s["littles_law"]
    assert ll["mean_in_system"] == pytest.approx(ll["throughput_x_mean_e2e"], rel=0.02)
    assert ll["mean_in_system"] > 5  # a loaded system, not a trivial check
    for pool in fleet.pools:
        for rep in pool.replicas:
            assert rep.max_usage <= 1.0
            assert rep.bm.check_no_leak() == []
    assert s["pools"]["p"]["peak_kv_usage"] <= 1.0


def test_prefix_affinity_beats_round_robin_on_mooncake(shared_data):
    rates = {}
    for policy in ("round_robin", "prefix_affinity"):
        sc = load_scenario(
            {
                "seed": 5,
                "workload": {
                    "trace": {
                        "format": "mooncake",
                        "path": str(shared_data / "traces" / "mooncake_conversation.jsonl"),
                        "limit": 600,
                    }
                },
                "pools": [
                    {
                        "name": "p",
                        "latency_model": "stub",
                        "replicas": 4,
                        "kv_blocks": 40000,
                        "max_model_len": 131072,
                    }
                ],
                "router": {"policy": policy},
            }
        )
        res = simulate(sc, models={"stub": AffineStepModel(10.0, 0.01, 0.3, 0.0002)}, plots=False)
        rates[policy] = res.summary["pools"]["p"]["prompt_cache_hit_rate"]
        assert res.summary["requests"]["ok"] == 600
    # first-admission hits of the requests' own prompts (vLLM's counter also counts recomputes)
    assert rates["prefix_affinity"] > 1.3 * rates["round_robin"] > 0, rates


@pytest.mark.parametrize("on_failure", ["retry", "drop"])
def test_failures_retry_or_drop_in_flight_requests(on_failure):
    sc = _sc(rate=4, duration=300, replicas=3)
    sc.pools[0].failure = FailureSpec(mtbf=60.0, repair=parse_dist(30.0, "repair"), on_failure=on_failure)
    res = simulate(sc, models={"stub": MODEL}, plots=False)
    s = res.summary
    created = s["pools"]["p"]["replicas_created"]
    assert created > 3  # failed replicas were replaced after repair
    if on_failure == "retry":
        assert s["requests"]["ok"] == s["requests"]["arrived"] and s["requests"]["retries"] > 0
    else:
        assert s["requests"]["failed"] > 0
        assert s["requests"]["ok"] + s["requests"]["failed"] == s["requests"]["arrived"]


def test_router_latency_adds_to_every_request():
    base = simulate(_sc(rate=0.05, duration=600), models={"stub": MODEL}, plots=False).fleet
    hop = simulate(
        _sc(rate=0.05, duration=600, router={"policy": "least_outstanding", "latency_ms": 7.5}),
        models={"stub": MODEL},
        plots=False,
    ).fleet
    # at this load every request finds the replica idle: each latency grows by exactly the hop
    np.testing.assert_array_equal(hop.requests.first_token - base.requests.first_token, 7_500_000_000)
    np.testing.assert_array_equal(hop.requests.finish - base.requests.finish, 7_500_000_000)
    np.testing.assert_array_equal(hop.arrival_ps, base.arrival_ps)


def test_autoscaler_in_the_loop_polls_sees_the_step_and_waits_for_startup():
    spec = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "running"},
        "spec": {
            "scaleTargetRef": {"name": "llm"},
            "pollingInterval": 15,
            "minReplicaCount": 1,
            "maxReplicaCount": 10,
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "running",
                    "metadata": {"query": "sum(vllm:num_requests_running)", "threshold": "4"},
                }
            ],
        },
    }
    sc = _sc(
        rate=None,
        duration=900,
        workload={
            "arrivals": {"piecewise": [[0, 0.2], [300, 0.2], [301, 3.0], [900, 3.0]]},
            "prompt_tokens": 500,
            "output_tokens": 200,
        },
        pools=[
            {
                "name": "p",
                "latency_model": "stub",
                "replicas": 1,
                "kv_blocks": 3000,
                "startup_delay": 60,
                "autoscaler": {"spec": spec},
            }
        ],
        metrics={"scrape_interval": 15, "rate_window": 60},
    )
    pool = simulate(sc, models={"stub": MODEL}, plots=False).fleet.pools[0]
    times = [t for t, _, _ in pool.decisions]
    assert np.allclose(np.diff(times), 15.0)  # called at its polling interval
    ups = [(t, a, b) for t, a, b in pool.scale_events if b > a]
    assert ups, "the load step scales the pool up"
    assert 300 < ups[0][0] <= 300 + 60  # after the step, once scrapes show it
    started = [r for r in pool.replicas if r.created > 0]
    assert started and all(r.ready_at is None or r.ready_at - r.created == 60 * 10**12 for r in started)
    assert all(r.ready_at is not None for r in started if r.created < 800 * 10**12)
