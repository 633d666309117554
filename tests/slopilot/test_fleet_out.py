"""`fleet up` into a folder holding an earlier run refuses (it would append to that run's decision log and
resume its policy state), unless --overwrite, which removes the earlier run's files first."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.commands.fleet import earlier_run

ROOT = Path(__file__).resolve().parents[2]
FLEET = str(ROOT / "examples" / "fleet_local.yaml")


def test_an_empty_or_missing_folder_holds_no_run(tmp_path):
    assert earlier_run(str(tmp_path)) == [] and earlier_run(str(tmp_path / "new")) == []
    (tmp_path / "notes.txt").write_text("mine")
    assert earlier_run(str(tmp_path)) == []


def test_an_earlier_run_is_refused_with_its_files_named(tmp_path, capsys):
    (tmp_path / "decisions.csv").write_text("t,replicas\n")
    (tmp_path / "state").mkdir()
    with pytest.raises(SystemExit, match=r"holds an earlier run \(decisions\.csv, state\).*--overwrite"):
        main(["fleet", "up", FLEET, "--out", str(tmp_path), "--duration", "1"])
    assert (tmp_path / "decisions.csv").exists()  # nothing removed without --overwrite


def test_pd_pool_logs_count_as_a_run(tmp_path):
    (tmp_path / "decisions-decode.csv").write_text("")
    (tmp_path / "summary.json").write_text("{}")
    assert earlier_run(str(tmp_path)) == ["decisions-decode.csv", "summary.json"]


def test_overwrite_removes_the_earlier_run_and_keeps_other_files(tmp_path, monkeypatch):
    from slopilot.commands import fleet

    started = []
    monkeypatch.setattr(fleet, "run_fleet", lambda cfg, out, *a, **k: started.append(out) or 0)
    (tmp_path / "decisions.csv").write_text("t,replicas\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "policy.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["fleet", "up", FLEET, "--out", str(tmp_path), "--overwrite"]) == 0
    assert started == [str(tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_live_demo_replaces_its_own_earlier_run(tmp_path, monkeypatch):
    """`demo --live` owns its folder: a second demo must not append to the first one's decision log (it
    did: 50 rows replayed where one run writes 25)."""
    from slopilot.commands import fleet

    seen = []

    def fake_run(cfg, out, *a, **k):
        seen.append(sorted(p.name for p in Path(out).iterdir()))
        raise SystemExit(0)  # stop before the replay check; what matters is the folder the run started in

    monkeypatch.setattr(fleet, "run_fleet", fake_run)
    (tmp_path / "decisions.csv").write_text("time,replicas\n1,1\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "report.html").write_text("the simulated demo's")
    with pytest.raises(SystemExit):
        main(["demo", "--live", "--out", str(tmp_path)])
    assert seen == [["report.html"]]
