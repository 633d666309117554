"""The shipped example plan (3 GPU/TP deployments x 3 engine settings, 3 policies over a simulated day)
finishes within 5 minutes on the default process pool. Slow: `pytest -m slow tests/test_plan_speed.py`;
the measured times are in docs/benchmarks.md."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slopilot.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plan_h100_a100.yaml"


@pytest.mark.slow
def test_example_plan_within_five_minutes(tmp_path):
    start, cpu = time.perf_counter(), time.process_time()
    assert main(["plan", str(EXAMPLE), "--out", str(tmp_path), "--no-progress"]) == 0
    wall = time.perf_counter() - start
    result = json.loads((tmp_path / "plan.json").read_text())
    assert len(result["candidates"]) == 9
    assert {len(c["policies"]) for c in result["candidates"]} == {0, 3}
    assert sum(len(c["policies"]) for c in result["candidates"]) == 9  # 3 policies on each deployment's best
    assert result["answer"]["met"]
    print(f"example plan: {wall:.0f} s wall, {result['simulations']} simulations, "
          f"{time.process_time() - cpu:.0f} s CPU in the parent")
    assert wall < 300, f"the example plan took {wall:.0f} s"
