"""The P/D autoscaler live: `fleet up examples/fleet_pd_autoscaled.yaml` (emulated Llama-3.1-70B TP4
replicas, the router in P/D mode, a pdModel InferenceAutoscaler on each pool) under its ramp of long
prompts: both pools scale up and back, and each pool's decision log replays, through `slopilot replay`
with the same step-time model, to the same decisions row for row."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fleet_pd_autoscaled.yaml"
MODEL = "llama-3.1-70b@h100-sxm-tp4-bf16"


@pytest.mark.slow  # about 4 minutes: the 200-s ramp, engine starts and drains
@pytest.mark.timeout(600)
def test_both_pools_scale_under_a_ramp_and_their_logs_replay(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["fleet", "up", str(EXAMPLE), "--out", str(out), "--duration", "200", "--no-dashboard"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    fleet = yaml.safe_load(EXAMPLE.read_text())
    events = summary["scale_events"]
    for role in ("prefill", "decode"):
        pool = f"{fleet['name']}-{role}"
        rows = list(csv.DictReader(io.StringIO((out / f"decisions-{pool}.csv").read_text())))
        desired = [int(r["desired_replicas"]) for r in rows]
        assert max(desired) >= 2, (role, desired)  # up with the ramp
        assert desired[-1] < max(desired), (role, desired)  # and back down after it
        assert all(r["reason"].startswith(f"pdModel/{role}") for r in rows[1:] if r["reason"])
        assert any(e["pool"] == role for e in events)
        spec = tmp_path / f"{role}.yaml"
        spec.write_text(yaml.safe_dump(fleet["pd"][role]["autoscaler"]))
        again = tmp_path / f"{role}-replayed.csv"
        assert main(["replay", "--spec", str(spec), "--metrics", str(out / f"decisions-{pool}.csv"),
                     "--step-model", MODEL, "-o", str(again)]) == 0
        replayed = list(csv.DictReader(io.StringIO(again.read_text())))
        key = ("time", "desired_replicas", "active", "reason")
        assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in replayed]
    req = summary["requests"]
    assert req["ok"] >= 0.95 * req["requests"], req  # every prompt fits the emulated engines' context
