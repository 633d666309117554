"""The plan's report renders (PNG sizes and axes, the HTML's table and images), bad plan files are
refused naming file, line and field, and the exit status follows --fail-on-slo-miss."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from simulator.planner.plan import load_plan
from simulator.planner.plots import capacity_figure, pareto_figure
from slopilot.cli import main

SPEC = Path(__file__).resolve().parents[2] / "examples" / "slo_model_spec.yaml"
PLAN = f"""name: tiny
seeds: [1]
duration: 3600
compress: 12
workload:
  arrivals: {{diurnal: {{mean: 2, amplitude: 0.5, period: 3600}}}}
  prompt_tokens: {{dist: lognormal, mean: 1155, median: 1020, max: 8000}}
  output_tokens: {{dist: lognormal, mean: 211, median: 129, max: 2048}}
slo:
  ttft: {{percentile: 90, seconds: 2.0}}
  tpot: {{percentile: 90, seconds: 0.1}}
startup_delay: 30
deployments:
  - {{name: h100-tp8, latency_model: h100-llama2-70b-tp8, price_per_gpu_hour: 3.0, max_model_len: 16384,
      prefix_caching: false}}
engine:
  max_num_seqs: [16, 64]
policies:
  - {{name: slo-model, spec: {SPEC}}}
search: {{duration: 60, drain: 120, start_rate: 2.0}}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "plan.yaml").write_text(PLAN)
    assert main(["plan", str(root / "plan.yaml"), "--out", str(root / "out"), "--workers", "1",
                 "--no-progress", "--fail-on-slo-miss"]) == 0
    return root / "out", json.loads((root / "out" / "plan.json").read_text())


def test_pngs_render_with_their_axes(report):
    out, result = report
    for name in ("pareto.png", "capacity.png"):
        img = matplotlib.image.imread(out / name)
        assert img.shape[0] >= 400 and img.shape[1] >= 800, name
        assert img.std() > 0.05, f"{name} is blank"
    fig = pareto_figure(result)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("SLO attainment") and ax.get_ylabel() == "cost per day (USD)"
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(result["ranking"])
    fig = capacity_figure(result)
    assert sorted(a.get_ylabel() for a in fig.axes) == ["TPOT p90 (s)", "TTFT p90 (s)"]
    for a in fig.axes:
        assert a.get_xlabel() == "requests per second, one replica"
        assert len(a.get_lines()) == len(result["candidates"]) + 1  # a curve each and the SLO line


def test_html_holds_the_answer_and_every_option(report):
    out, result = report
    html = (out / "report.html").read_text()
    assert result["answer"]["text"] in html
    assert html.count("<tr>") >= len(result["ranking"]) + len(result["candidates"])
    assert "pareto.png" in html and "capacity.png" in html
    assert len(list((out / "scenarios").glob("*.yaml"))) >= 3 * len(result["candidates"])


def test_plan_json_fields(report):
    _, result = report
    assert result["answer"]["met"]
    for c in result["candidates"]:
        st = c["static"]
        assert st["gpus"] == st["replicas"] * 8 == c["gpus_per_replica"] * st["replicas"]
        assert st["cost_per_day"] == pytest.approx(24 * st["cost_per_hour"])
        assert c["oracle"]["cost_per_day"] <= st["cost_per_day"]
    first = result["ranking"][0]
    assert first["met"]
    assert first["cost_per_day"] == min(o["cost_per_day"] for o in result["ranking"] if o["met"])


@pytest.mark.parametrize("edit,message", [
    (("price_per_gpu_hour: 3.0", "price_per_gpu_hour: -3"),
     "plan.yaml:14: deployments[0].price_per_gpu_hour: must be > 0, got -3"),
    (("seeds: [1]", "seeds: [1]\ncolour: blue"), "plan.yaml:3: colour: unknown field"),
    (("h100-llama2-70b-tp8", "h900-tp8"),
     "plan.yaml:14: deployments[0].latency_model: latency model 'h900-tp8'"),
    (("max_num_seqs: [16, 64]", "max_num_seqs: []"),
     "plan.yaml:17: engine.max_num_seqs: must have at least 1"),
    ((str(SPEC), "nowhere.yaml"), "plan.yaml:19: policies[0].spec: file not found"),
    (("duration: 3600\n", ""), "plan.yaml:1: duration: is required"),
    (("diurnal: {mean: 2,", "diurnal: {mean: -2,"),
     "plan.yaml:6: workload.arrivals.diurnal.mean: must be > 0"),
    (("prefix_caching: false}", "kv_memory: {gpu_memory_gib: 10, weights_gib: 130, kv_bytes_per_token: 1}}"),
     "plan.yaml:14: deployments[0]: as a scenario: pools[0].kv_memory: leaves no room for the KV cache"),
    (("startup_delay: 30", "startup_delay: {dist: uniform, low: 5}"),
     "plan.yaml:12: startup_delay.high: required for dist 'uniform'"),
])
def test_bad_plans_name_file_line_and_field(tmp_path, edit, message):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace(*edit))
    with pytest.raises(ValueError) as err:
        load_plan(str(path))
    assert str(err.value).startswith(str(path.parent / message))


def test_exit_status_when_no_candidate_meets(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    impossible = PLAN.replace("seconds: 2.0", "seconds: 0.001").replace("[16, 64]", "[64]")
    path.write_text(impossible.replace(f"policies:\n  - {{name: slo-model, spec: {SPEC}}}\n", ""))
    assert main(["plan", str(path), "--out", str(tmp_path / "a"), "--workers", "1", "--no-progress",
                 "--no-plots"]) == 0
    assert main(["plan", str(path), "--out", str(tmp_path / "b"), "--workers", "1", "--no-progress",
                 "--no-plots", "--fail-on-slo-miss"]) == 1
    assert "No candidate meets every SLO" in capsys.readouterr().out
    path.write_text(PLAN.replace("price_per_gpu_hour: 3.0", "price_per_gpu_hour: 0"))
    assert main(["plan", str(path), "--out", str(tmp_path / "c")]) == 2
    assert "price_per_gpu_hour: must be > 0" in capsys.readouterr().err


def test_html_shows_numbers_for_humans(report):
    # raw values (0.022854, False) used to reach the tables: now units, money, percentages and yes/NO
    import re

    out, result = report
    html = (out / "report.html").read_text()
    cells = re.findall(r"<td>([^<]*)</td>", html)
    assert not [c for c in cells if c in ("True", "False", "None")]
    assert not [c for c in cells if re.fullmatch(r"-?[\d,]*\.\d{5,}", c)], cells  # e.g. 0.022854
    c = result["candidates"][0]
    assert f"<td>{c['capacity']['rps']:.3g} req/s</td>" in html
    assert f"<td>{c['static']['cost_per_hour']:,.2f} USD</td>" in html
    assert "the curve of 60 min simulated in 5 min (x12)" in html
    first = result["ranking"][0]
    assert f"<td>{100 * first['attainment']:.2f}%</td><td>yes</td>" in html
