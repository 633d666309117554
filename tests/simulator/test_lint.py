"""Unit and placement mistakes are warned about, never refused (issue: a TPOT target of `seconds: 100`
meant as ms was "met"; `metricType: Value` under `metadata:` and a misspelled `activationTreshold` were
ignored and changed decisions; `duration: 1800000` in a plan ran 727 s with no progress off a
terminal). `slopilot lint` prints them; replay, simulate, plan and control print them at load."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from simulator.lint import lint_file
from simulator.planner.progress import SweepProgress
from simulator.timeline import ProgressLines
from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
SO = """apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama}
spec:
  scaleTargetRef: {name: llama-70b}
  maxReplicaCount: 10
  triggers:
    - type: prometheus
      name: queue
      metadata:
        query: sum(vllm:num_requests_waiting)
        threshold: "5"
        metricType: Value
        activationTreshold: "2"
"""
PLACEMENT = ("so.yaml:13: spec.triggers[0].metadata.metricType: metricType belongs beside metadata (at "
             "spec.triggers[0].metricType), not under it: it is ignored here")
SPELLING = ("so.yaml:14: spec.triggers[0].metadata.activationTreshold: not a prometheus trigger setting (did "
            "you mean activationThreshold?): it is ignored")


def test_lint_names_misplaced_and_misspelled_trigger_keys(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("so.yaml").write_text(SO)
    assert main(["lint", "so.yaml"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"warning: {PLACEMENT}", f"warning: {SPELLING}"]
    assert main(["lint", "--strict", "so.yaml"]) == 1


def test_replay_and_control_print_them_at_load(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("so.yaml").write_text(SO)
    Path("series.csv").write_text("time,queue\n0,1\n30,9\n")
    assert main(["replay", "--spec", "so.yaml", "--metrics", "series.csv"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {PLACEMENT}" in err and f"warning: {SPELLING}" in err
    main(["control", "--spec", "so.yaml", "--prometheus", "http://127.0.0.1:9", "--once", "--dry-run",
          "--timeout", "0.2"])
    err = capsys.readouterr().err
    assert f"WARNING {PLACEMENT}\n" in err and f"WARNING {SPELLING}\n" in err


def scenario(tmp_path: Path, **changes) -> Path:
    sc = yaml.safe_load((ROOT / "examples" / "keda_queue.yaml").read_text())
    sc["duration"] = 300
    for key, value in changes.items():
        sc[key] = value
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(sc, sort_keys=False))
    return path


def test_slo_seconds_that_look_like_milliseconds_and_long_durations(tmp_path):
    path = scenario(tmp_path, slo={"ttft": {"percentile": 90, "seconds": 2000},
                                   "tpot": {"percentile": 90, "seconds": 100}},
                    metrics={"scrape_interval": 600}, duration=1800000)
    text = path.read_text().splitlines()
    line = {k: 1 + next(i for i, t in enumerate(text) if t.strip().startswith(k)) for k in ("duration:",)}
    got = lint_file(path)
    assert any(w.endswith("slo.ttft.seconds: 2000 s for a TTFT target is above 600 s: milliseconds meant? "
                          "(the unit is seconds: 2 for 2000 ms)") for w in got), got
    assert any(w.endswith("slo.tpot.seconds: 100 s for a TPOT target is above 10 s: milliseconds meant? "
                          "(the unit is seconds: 0.1 for 100 ms)") for w in got), got
    assert (f"{path}:{line['duration:']}: duration: 1,800,000 s is over 7 days: milliseconds meant? "
            "(the unit is seconds)") in got
    assert len(got) == 3  # the 600 s scrape interval is within the (long) run


def test_an_interval_longer_than_the_run_and_simulate_prints_the_warnings(tmp_path, capsys):
    path = scenario(tmp_path, metrics={"scrape_interval": 600}, duration=120,
                    slo={"tpot": {"percentile": 90, "seconds": 100}})
    sc = yaml.safe_load(path.read_text())
    sc["pools"][0]["autoscaler"]["spec"]["spec"]["pollingInterval"] = 900
    path.write_text(yaml.safe_dump(sc, sort_keys=False))
    got = lint_file(path)
    assert any(w.endswith("metrics.scrape_interval: 600 s is longer than the run (120 s): never scraped")
               for w in got), got
    assert any(w.endswith("pools[0].autoscaler.spec.spec.pollingInterval: 900 s is longer than the run "
                          "(120 s): the policy never acts") for w in got), got
    main(["simulate", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--no-progress"])
    err = capsys.readouterr().err
    assert all(f"warning: {w}" in err for w in got)


def test_the_examples_have_no_warnings():
    for name in ("keda_queue.yaml", "plan_h100_a100.yaml", "fleet_local.yaml", "slo_model_spec.yaml",
                 "azure_conv_h100.yaml", "slo_model_autoscale.yaml"):
        assert lint_file(ROOT / "examples" / name) == [], name


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Fleet:
    arrived = 12345


def test_progress_off_a_terminal_is_a_line_every_30_s_with_time_requests_and_eta():
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines(Fleet(), total=1800 * 10**12, clock=clock, out=out)  # 1800 s in picoseconds
    clock.t = 10
    lines.update(None, 300 * 10**12)  # within 30 s of the start: nothing
    clock.t = 31
    lines.update(None, 600 * 10**12)
    clock.t = 45
    lines.update(None, 700 * 10**12)  # within 30 s of the last line: nothing
    assert out.getvalue().splitlines() == [
        "simulated 600 of 1,800 s (33%), 12,345 requests arrived, 31 s elapsed, ETA 62 s"]


def test_plan_progress_off_a_terminal(capsys):
    clock = Clock()
    with SweepProgress("lines", clock=clock) as p:
        p.stage("capacity and static fleets")
        p.add(10)
        clock.t = 40
        for _ in range(4):
            p.advance()
    assert capsys.readouterr().err.splitlines() == [
        "capacity and static fleets: 1 of 10 simulations asked so far, 40 s elapsed, ETA 360 s for those"]
