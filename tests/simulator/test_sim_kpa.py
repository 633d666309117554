"""The KPA in the simulator: its options in the fast path and step by step, and a KPA spec file through
`slopilot simulate`."""

import json

import pytest

from simulator.run import simulate
from slopilot.cli import main


def scenario(autoscaler=None, duration=300, slo=None, **pool) -> dict:
    p = {"name": "h100", "latency_model": "h100-llama2-70b-tp4", "replicas": 1, **pool}
    if autoscaler is not None:
        p["autoscaler"] = autoscaler
    return {
        "seed": 1,
        "duration": duration,
        "workload": {"arrivals": {"piecewise": [[0, 0.5], [100, 0.5], [110, 8], [200, 8], [210, 0.5]]},
                     "prompt_tokens": 400, "output_tokens": 60},
        "pools": [p],
        "slo": slo or {"ttft": {"percentile": 90, "seconds": 2.0}},
    }


def kpa(**options) -> dict:
    spec = {"scaleTargetRef": {"name": "x"}, "minReplicas": options.pop("min", 1), "maxReplicas": 8,
            "policy": {"type": "kpa", "kpa": {"target": 4, **options}}}
    return {"spec": {"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler",
                     "metadata": {"name": "k"}, "spec": spec}}


# ---- the KPA in the simulator ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,fast",
    [
        ({}, True),
        ({"min": 0}, True),
        ({"metric": "rps", "target": 1}, True),
        ({"scaleDownDelaySeconds": 30, "stableWindowSeconds": 30}, True),
        ({}, False),
    ],
)
def test_kpa_policy_runs_in_the_simulator(options, fast):
    res = simulate(scenario(kpa(**options)), fast=fast, plots=False)
    pool = res.fleet.pools[0]
    assert res.summary["requests"]["arrived"] > 100
    assert pool.scale_events, "the burst should move the KPA"
    assert max(e[2] for e in pool.scale_events) > 1


def test_kpa_spec_file_through_the_cli(tmp_path, capsys):
    (tmp_path / "kpa.yaml").write_text(json.dumps(kpa()["spec"]))
    sc = scenario({"spec": "kpa.yaml"})
    (tmp_path / "sc.yaml").write_text(json.dumps(sc))
    assert main(["simulate", str(tmp_path / "sc.yaml"), "-o", str(tmp_path / "out"), "--no-plots"]) == 0
    assert "scale events:" in capsys.readouterr().out
