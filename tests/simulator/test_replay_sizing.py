"""The replay sizing search (simulator.planner.replay_sizing) and issue 32's capacity answer in small
(bench/kvtier_capacity.py on the example's first minutes: docs/kv_tiers.md has the full run)."""

from pathlib import Path

import pytest

from simulator.planner.replay_sizing import fewest_replicas, meets, with_replicas

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kvtier_mooncake_70b.yaml"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_conversation.jsonl"


def _scenario() -> dict:
    return {"name": "sizing", "seed": 1, "duration": 120,
            "workload": {"arrivals": {"rate": 6}, "prompt_tokens": {"dist": "lognormal", "mean": 2000,
                                                                    "median": 1500, "max": 8000},
                         "output_tokens": {"dist": "lognormal", "mean": 200, "median": 150, "max": 1000}},
            "pools": [{"name": "h100", "latency_model": "h100-llama2-70b-tp4", "replicas": 1,
                       "max_model_len": 16384, "prefix_caching": False}],
            "router": {"policy": "least_outstanding"},
            "slo": {"ttft": {"percentile": 90, "seconds": 1.0}, "tpot": {"percentile": 90, "seconds": 0.1}}}


def test_fewest_replicas_is_the_edge_between_a_miss_and_a_meet():
    found = fewest_replicas(_scenario(), start=1)
    n, runs = found["replicas"], found["runs"]
    assert n is not None and n > 1
    assert meets(runs[n]) and not meets(runs[n - 1])  # both sides of the edge were run
    assert all(meets(s) == (k >= n) for k, s in runs.items())  # monotone over what was tried
    assert with_replicas(_scenario(), 3)["pools"][0]["autoscaler"] == {"fixed": 3}


def test_fewest_replicas_says_none_within_the_limit():
    sc = _scenario()
    sc["slo"]["ttft"]["seconds"] = 0.001  # no fleet prefills a prompt in a millisecond
    found = fewest_replicas(sc, start=2, limit=4)
    assert found["replicas"] is None and sorted(found["runs"]) == [2, 4]


@pytest.mark.slow  # 20 runs of 8 minutes of the trace on 70B replicas: 313 s at load average 3-7
@pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE}")
def test_capacity_answer_small():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from kvtier_capacity import main

    rows = main([str(EXAMPLE), "--duration", "480", "--start", "8"])
    tier, gpu = rows["256 GiB tier / approximate"], rows["GPU only / approximate"]
    assert tier["replicas"] is not None and gpu["replicas"] is not None
    assert tier["offload_hit_rate"] > 0 and tier["hit_rate"] > gpu["hit_rate"]
    assert tier["replicas"] <= gpu["replicas"]
