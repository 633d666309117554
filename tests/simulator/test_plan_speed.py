"""The shipped example plan (3 GPU/TP deployments x 3 engine settings, 3 policies over a simulated day)
finishes within 5 minutes on the default process pool, and Ray in local mode gives the same plan.json.
Slow: `pytest -m slow tests/simulator/test_plan_speed.py`; the measured times are in docs/benchmarks.md."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slopilot.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plan_h100_a100.yaml"


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("example")
    start = time.perf_counter()
    assert main(["plan", str(EXAMPLE), "--out", str(out), "--no-progress"]) == 0
    return out, time.perf_counter() - start


@pytest.mark.slow
def test_example_plan_within_five_minutes(pool_run):
    out, wall = pool_run
    result = json.loads((out / "plan.json").read_text())
    assert len(result["candidates"]) == 9
    assert {len(c["policies"]) for c in result["candidates"]} == {0, 3}
    assert sum(len(c["policies"]) for c in result["candidates"]) == 9  # 3 policies on each deployment's best
    assert result["answer"]["met"]
    print(f"example plan: {wall:.0f} s wall, {result['simulations']} simulations")
    assert wall < 300, f"the example plan took {wall:.0f} s"


@pytest.mark.slow
def test_example_plan_on_ray_local_is_identical(pool_run, tmp_path):
    pytest.importorskip("ray", reason="the ray package is not installed (pip install ray): Ray NOT checked")
    out, _ = pool_run
    assert main(["plan", str(EXAMPLE), "--out", str(tmp_path), "--ray", "local", "--no-progress"]) == 0
    assert (tmp_path / "plan.json").read_bytes() == (out / "plan.json").read_bytes()
