"""The plan's engine grid takes chunked prefill on and off, like max_num_seqs: each setting is its own
candidate, its scenarios carry the pool field, its static fleet equals `slopilot simulate` runs, and a
setting the scheduler cannot run (whole prompts longer than the step budget) is a plan error."""

from __future__ import annotations

import pytest

from simulator.planner.plan import load_plan
from simulator.planner.verdict import meets
from tests.simulator.test_plan_brute_force import SEEDS, folder, run_plan, scenario, simulate

PLAN = f"""
name: chunking
seeds: {SEEDS}
duration: 3600
compress: 12
workload:
  arrivals: {{process: gamma, cv: 1.09, diurnal: {{mean: 3, amplitude: 0.5, period: 3600}}}}
  prompt_tokens: {{dist: lognormal, mean: 1155, median: 1020, max: 8000}}
  output_tokens: {{dist: lognormal, mean: 211, median: 129, max: 2048}}
slo:
  ttft: {{percentile: 90, seconds: 2.0}}
  tpot: {{percentile: 90, seconds: 0.1}}
deployments:
  - {{name: h100-tp4, latency_model: h100-llama2-70b-tp4, price_per_gpu_hour: 3.0, max_model_len: 16384,
      prefix_caching: false}}
engine:
  chunked_prefill: [true, false]
search: {{duration: 60, drain: 120, start_rate: 2.0}}
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    return run_plan(tmp_path_factory.mktemp("plan"), PLAN)


def test_each_setting_is_a_candidate_whose_static_fleet_equals_simulate_runs(planned, tmp_path):
    out, result = planned
    by_setting = {c["engine"]["chunked_prefill"]: c for c in result["candidates"]}
    assert set(by_setting) == {True, False}
    for chunked, c in by_setting.items():
        peak = scenario(out, c["name"], "peak")
        assert peak["pools"][0]["chunked_prefill"] is chunked
        pool = peak["pools"][0]
        assert "max_num_batched_tokens" not in pool  # the scenario default: 16384 without chunking
        n = c["static"]["replicas"]
        runs = [simulate({**peak, "pools": [{**pool, "replicas": n}]}, s, tmp_path / folder(c["name"], n, s))
                for s in SEEDS]
        assert all(meets(s) for s in runs), c["name"]
        assert min(s["slo_attainment_joint"] for s in runs) == c["static"]["attainment_at_peak"]
        if n > 1:
            fewer = simulate({**peak, "pools": [{**pool, "replicas": n - 1}]}, SEEDS[0],
                             tmp_path / folder(c["name"], n - 1))
            fewer_2 = simulate({**peak, "pools": [{**pool, "replicas": n - 1}]}, SEEDS[1],
                               tmp_path / folder(c["name"], n - 1, 2))
            assert not (meets(fewer) and meets(fewer_2)), c["name"]


def test_a_budget_below_the_model_length_without_chunking_names_the_plan_field(tmp_path):
    bad = PLAN.replace("chunked_prefill: [true, false]",
                       "chunked_prefill: [false]\n  max_num_batched_tokens: [4096]")
    (tmp_path / "plan.yaml").write_text(bad)
    rule = r"max_num_batched_tokens.*without chunked prefill.*\(4096\).*\(16384\)"
    with pytest.raises(ValueError, match=rule):
        load_plan(tmp_path / "plan.yaml")
