"""The same plan gives byte-identical plan.json in this process, on a local process pool, and on Ray in
local mode (seeded runs; results assembled in the plan's order, not the order runs finish)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main

SPEC = Path(__file__).resolve().parents[2] / "examples" / "slo_model_spec.yaml"
PLAN = f"""seeds: [1, 2]
duration: 3600
compress: 12
workload:
  arrivals: {{diurnal: {{mean: 2, amplitude: 0.5, period: 3600}}}}
  prompt_tokens: {{dist: lognormal, mean: 1155, median: 1020, max: 8000}}
  output_tokens: {{dist: lognormal, mean: 211, median: 129, max: 2048}}
slo: {{ttft: {{percentile: 90, seconds: 2.0}}, tpot: {{percentile: 90, seconds: 0.1}}}}
deployments:
  - {{name: h100-tp8, latency_model: h100-llama2-70b-tp8, price_per_gpu_hour: 3.0, prefix_caching: false}}
  - {{name: a100-tp8, latency_model: a100-llama2-70b-tp8, price_per_gpu_hour: 1.8, prefix_caching: false}}
policies:
  - {{name: slo-model, spec: {SPEC}}}
search: {{duration: 60, drain: 120, start_rate: 2.0}}
"""


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    root = tmp_path_factory.mktemp("runners")
    (root / "plan.yaml").write_text(PLAN)
    assert main(["plan", str(root / "plan.yaml"), "--out", str(root / "serial"), "--workers", "1",
                 "--no-plots", "--no-progress"]) == 0
    return root, (root / "serial" / "plan.json").read_bytes()


def test_process_pool_gives_the_same_plan(serial):
    root, expected = serial
    assert main(["plan", str(root / "plan.yaml"), "--out", str(root / "pool"), "--workers", "2", "--no-plots",
                 "--no-progress"]) == 0
    assert (root / "pool" / "plan.json").read_bytes() == expected


def test_ray_local_mode_gives_the_same_plan(serial):
    pytest.importorskip("ray", reason="the ray package is not installed (pip install ray): Ray NOT checked")
    root, expected = serial
    assert main(["plan", str(root / "plan.yaml"), "--out", str(root / "ray"), "--ray", "local", "--workers",
                 "2", "--no-plots", "--no-progress"]) == 0
    assert (root / "ray" / "plan.json").read_bytes() == expected
