"""`slopilot simulate` on the shipped examples (shortened), its outputs, and byte-identical reruns."""

import csv
import json
from pathlib import Path

import pytest

from simulator.run import simulate
from simulator.scenario import load_scenario
from slopilot.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SYNTHETIC = ["azure_conv_h100", "diurnal_schedule", "keda_queue", "slo_model_autoscale"]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_example_runs_shortened(name, tmp_path, capsys):
    out = tmp_path / name
    rc = main(
        ["simulate", str(EXAMPLES / f"{name}.yaml"), "--out", str(out), "--duration", "150", "--no-plots"]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["arrived"] > 50
    assert (
        summary["requests"]["ok"] + summary["requests"]["unfinished"] + summary["requests"]["failed"]
        == summary["requests"]["arrived"]
    )
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= summary["requests"]["arrived"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(float(r["ttft"]) > 0 and float(r["e2e"]) >= float(r["ttft"]) for r in ok)
    with open(out / "timeline.csv") as f:
        tl = list(csv.DictReader(f))
    assert tl and all(0 <= float(r["kv_usage"]) <= 1 for r in tl)
    printed = capsys.readouterr().out
    missed = [k for k, v in summary["slo"].items() if not v["met"]]
    assert ("requests ok" in printed) == (not missed)  # never "ok" for a run that missed an SLO
    assert printed.startswith(f"SLOs MISSED ({', '.join(missed)})" if missed else "all SLOs met")
    assert all(f"SLO {k} p" in printed for k in summary["slo"])


def test_mooncake_example_shortened(shared_data, tmp_path):
    sc = load_scenario(EXAMPLES / "mooncake_prefix.yaml")
    sc.workload["trace"]["path"] = str(shared_data / "traces" / "mooncake_conversation.jsonl")
    sc.duration = 60
    res = simulate(sc, tmp_path, plots=False)
    s = res.summary
    assert s["requests"]["ok"] == s["requests"]["arrived"] > 100
    assert s["pools"]["h100"]["prompt_cache_hit_rate"] > 0


def test_same_seed_gives_byte_identical_outputs(tmp_path):
    outs = []
    for k in ("a", "b"):
        out = tmp_path / k
        assert (
            main(
                [
                    "simulate",
                    str(EXAMPLES / "keda_queue.yaml"),
                    "--out",
                    str(out),
                    "--duration",
                    "120",
                    "--seed",
                    "9",
                ]
            )
            == 0
        )
        outs.append(out)
    files = sorted(p.name for p in outs[0].iterdir())
    assert {
        "requests.csv",
        "timeline.csv",
        "summary.json",
        "report.html",
        "replicas_vs_load.png",
        "latency_over_time.png",
        "latency_cdfs.png",
    } <= set(files)
    for name in files:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    other = tmp_path / "c"
    main(
        [
            "simulate",
            str(EXAMPLES / "keda_queue.yaml"),
            "--out",
            str(other),
            "--duration",
            "120",
            "--seed",
            "10",
            "--no-plots",
        ]
    )
    assert (other / "requests.csv").read_bytes() != (outs[0] / "requests.csv").read_bytes()


def test_bad_scenario_reports_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "keda_queue.yaml").read_text().replace("replicas: 2", "replicas: two"))
    assert main(["simulate", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "pools[0].replicas: must be an integer" in capsys.readouterr().err
