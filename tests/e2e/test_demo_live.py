"""`slopilot demo --live --out DIR` as `make demo` runs it (about two minutes, so marked slow), from a
fresh clone of the committed tree (a file left uncommitted fails it): it exits 0, writes the decision
log, the spec it ran, summary.json and the dashboard's last frame, scales up under the ramp and back
down, and its decisions.csv replays through `slopilot replay` (a separate process) and through the
simulator's reconcile step to the same decisions, row for row."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_control_e2e import decisions, read_log, replay_cli, scale_orders, simulator_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_live_runs_and_its_decision_log_replays(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is not installed (Debian package: prometheus)")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=60)
    env = {**os.environ, "PYTHONPATH": str(clone)}  # the clone's packages, not the working tree's
    out = tmp_path / "demo"
    started = time.monotonic()
    cmd = [sys.executable, "-m", "slopilot.cli", "demo", "--live", "--out", str(out)]
    done = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=400)
    wall = time.monotonic() - started
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    print(done.stdout[-2500:])
    print(f"demo --live took {wall:.0f} s")

    specs = sorted(out.glob("*.yaml"))
    assert len(specs) == 1, specs
    for name in ("decisions.csv", "summary.json", "dashboard.txt"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    rows = read_log(out / "decisions.csv")
    orders = scale_orders(rows)
    t0 = float(rows[0]["time"])
    print("scale orders:", [(round(t - t0, 1), a, b, why[:40]) for t, a, b, why in orders])
    print("requests:", summary.get("requests"))
    assert any(b > a for _, a, b, _ in orders) and orders[-1][2] < max(b for _, _, b, _ in orders), \
        "the demo scales up under the ramp and back down after it"
    assert [(e["from"], e["to"]) for e in summary["scale_events"]] == [(a, b) for _, a, b, _ in orders]
    assert summary["requests"]["ok"] > 0
    assert "replayed" in done.stdout and f"{len(rows)}/{len(rows)} decisions identical" in done.stdout

    live = decisions(rows)
    assert decisions(replay_cli(specs[0], out / "decisions.csv")) == live
    assert simulator_step(specs[0], out / "decisions.csv") == live
    print(f"{len(live)} decisions identical live, in `slopilot replay` and in the simulator step")
