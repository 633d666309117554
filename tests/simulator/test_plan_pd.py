"""The plan's P:D search (simulator.planner.pd_plan) on a small plan: at each load level the cheapest
aggregated fleet and P/D split, each met in its own run and one count fewer missed; the CLI's table;
bad pd sections named."""

from __future__ import annotations

import json

import pytest

from simulator.planner.pd_plan import pd_plan_task, role_candidates
from simulator.planner.plan import load_plan
from simulator.planner.sweep import SerialRunner, drive
from slopilot.cli import main

# long prompts, short outputs (the code-completion shape): prefill is most of the work
PLAN = """
name: pd-small
seeds: [1]
duration: 600
workload:
  arrivals: {rate: 4}
  prompt_tokens: {dist: lognormal, mean: 3000, median: 2500, max: 8000}
  output_tokens: {dist: lognormal, mean: 40, median: 30, max: 200}
slo:
  ttft: {percentile: 90, seconds: 2.0}
  tpot: {percentile: 90, seconds: 0.1}
deployments:
  - {name: h100, latency_model: h100-llama2-70b-tp4, price_per_gpu_hour: 3.0, max_model_len: 16384,
     prefix_caching: false}
search: {duration: 120, peak_duration: 120, max_duration: 240, drain: 60, start_rate: 2}
pd:
  threshold: 1024
  link: {bandwidth_gbs: 50, latency_ms: 0.5}
  kv_bytes_per_token: 327680
  levels: [0.5, 1.0]
"""


def test_each_level_has_the_cheapest_of_each_kind_and_one_fewer_misses():
    plan = load_plan(PLAN)
    out = drive({"pd": pd_plan_task(plan, 4.0, 2.0)}, SerialRunner())["pd"]
    assert [lv["rate"] for lv in out["levels"]] == [2.0, 4.0]
    for lv in out["levels"]:
        agg, pd = lv["aggregated"], lv["pd"]
        assert agg and pd
        n, p, d = agg["replicas"], pd["prefill"], pd["decode"]
        assert agg["gpus"] == 4 * n and pd["gpus"] == 4 * (p + d)
        assert agg["attainment"] > 0
        assert pd["goodput_per_gpu"] == pytest.approx(pd["goodput_rps"] / pd["gpus"])
        for e in (agg, pd):
            assert e["slo"]["ttft"] <= 2.0 and e["slo"]["tpot"] <= 0.1
        # the searches ran one fewer and found it missing (1 replica never needs a check below it)
        assert n == 1 or n - 1 in lv["tried"]["aggregated"]
        assert d == 1 or [p, d - 1] in lv["tried"]["pd"]
    # with these prompts the prefill pool is the larger one at the peak
    peak = out["levels"][-1]["pd"]
    assert peak["prefill"] >= peak["decode"]


def test_the_cli_prints_and_writes_the_table(tmp_path, capsys):
    f = tmp_path / "plan.yaml"
    f.write_text(PLAN.replace("levels: [0.5, 1.0]", "levels: [1.0]"))
    assert main(["plan", str(f), "--out", str(tmp_path / "out"), "--workers", "1", "--no-plots",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "| load | req/s | aggregated | GPUs | goodput/GPU" in text
    got = json.loads((tmp_path / "out" / "pd.json").read_text())
    assert got["levels"][0]["pd"]["prefill"] >= 1
    assert (tmp_path / "out" / "pd.md").read_text().startswith("| load |")


def test_bad_pd_sections_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"pd\.prefill_deployment: no deployment named 'b200'"):
        load_plan(PLAN.replace("levels: [0.5, 1.0]", "prefill_deployment: b200"))
    with pytest.raises(ValueError, match=r"pd\.levels\[0\]: must be > 0"):
        load_plan(PLAN.replace("levels: [0.5, 1.0]", "levels: [0]"))
    plan = load_plan(PLAN)
    assert [c.name for c in role_candidates(plan)] == ["h100", "h100"]
    from simulator.planner.pd_plan import check

    no_bytes = load_plan(PLAN.replace("  kv_bytes_per_token: 327680\n", ""))
    with pytest.raises(ValueError, match="pd: as a scenario: .*kv_bytes_per_token"):
        check(no_bytes)
