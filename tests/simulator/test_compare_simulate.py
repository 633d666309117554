"""`slopilot compare` on the three policy examples (a KEDA queue ScaledObject, the ratio law and the
model-based SLO-headroom InferenceAutoscaler) over the KEDA example's workload: each row equals a
separate `slopilot simulate` of the scenario with that spec, the static and oracle rows are there, the
plot renders, and --fail-on-slo-miss exits 1 because the KEDA row (minReplicaCount 0) misses."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib.image
import pytest
import yaml

from simulator.planner.compare_report import replicas_figure
from slopilot.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCENARIO = EXAMPLES / "keda_queue.yaml"
SPECS = [EXAMPLES / "replay" / "keda_queue.yaml", EXAMPLES / "replay" / "ratio.yaml",
         EXAMPLES / "slo_model_spec.yaml"]
DURATION = 900


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    args = ["compare", str(SCENARIO), *[a for s in SPECS for a in ("--spec", str(s))], "--out", str(out),
            "--duration", str(DURATION), "--capacity-duration", "120", "--workers", "1", "--no-progress",
            "--fail-on-slo-miss"]
    rc = main(args)
    return rc, out, json.loads((out / "compare.json").read_text())


def test_each_row_equals_a_simulate_run(compared, tmp_path):
    _, _, result = compared
    rows = {r["spec"]: r for r in result["rows"] if r["kind"] == "spec"}
    assert set(rows) == {str(s.resolve()) for s in SPECS}
    base = yaml.safe_load(SCENARIO.read_text())
    for spec in SPECS:
        sc = copy.deepcopy(base)
        for pool in sc["pools"]:
            pool.pop("autoscaler", None)
        sc["autoscaler"] = {"spec": str(spec.resolve())}
        sc["duration"] = DURATION
        path = tmp_path / f"{spec.stem}.yaml"
        path.write_text(yaml.safe_dump(sc))
        main(["simulate", str(path), "--out", str(tmp_path / spec.stem), "--no-plots", "--no-progress"])
        summary = json.loads((tmp_path / spec.stem / "summary.json").read_text())
        row = rows[str(spec.resolve())]
        assert row["summary"] == summary, spec.name
        assert row["gpu_hours"] == summary["costs"]["gpu_hours"]
        assert row["attainment"] == summary["slo_attainment_joint"]


def test_static_and_oracle_rows(compared):
    _, _, result = compared
    kinds = [r["kind"] for r in result["rows"]]
    assert kinds == ["spec", "spec", "spec", "static", "oracle"]
    static, oracle = result["rows"][3], result["rows"][4]
    n = result["sizing"]["static"]["replicas"]
    assert static["peak_replicas"] == n and static["scale_events"] == 0 and static["met"]
    assert oracle["gpu_hours"] <= static["gpu_hours"]
    assert oracle["x_oracle"] == 1.0
    assert result["sizing"]["peak_rps"] > 0 and result["sizing"]["capacity"]["rps"] > 0


def test_exit_status_and_plot(compared):
    rc, out, result = compared
    missed = [r["name"] for r in result["rows"] if r["kind"] == "spec" and not r["met"]]
    assert missed == ["llama-queue"] and rc == 1
    img = matplotlib.image.imread(out / "replicas.png")
    assert img.shape[0] > 300 and img.shape[1] > 800 and img.std() > 0.05
    fig = replicas_figure(result)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (min)" and "replicas" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [r["name"] for r in result["rows"]]
    html = (out / "report.html").read_text()
    assert all(r["name"] in html for r in result["rows"]) and "replicas.png" in html


def test_specs_sharing_a_name_are_labelled_by_their_files(tmp_path):
    # two specs with the same metadata.name used to show as `llama-queue` and `llama-queue'`
    from simulator.planner.compare import spec_rows

    text = (EXAMPLES / "replay" / "keda_queue.yaml").read_text()
    (tmp_path / "a").mkdir()
    paths = [tmp_path / "queue5.yaml", tmp_path / "queue10.yaml", tmp_path / "a" / "queue5.yaml"]
    for p in paths:
        p.write_text(text)
    name = next(iter(spec_rows([str(paths[0])])))
    rows = spec_rows([str(p) for p in paths[:2]] + [str(EXAMPLES / "replay" / "ratio.yaml")])
    assert list(rows)[:2] == [f"{name} (queue5.yaml)", f"{name} (queue10.yaml)"]
    assert "'" not in "".join(rows) and len(rows) == 3
    assert rows[f"{name} (queue10.yaml)"] == str(paths[1].resolve())
    # same file name in two folders: the paths as given
    rows = spec_rows([str(paths[0]), str(paths[2])])
    assert list(rows) == [f"{name} ({paths[0]})", f"{name} ({paths[2]})"]
    # the same file twice still gives two rows
    assert list(spec_rows([str(paths[1])] * 2)) == [f"{name} (queue10.yaml)", f"{name} (queue10.yaml) #2"]


def test_compare_prints_distinct_labels_for_specs_sharing_a_name(tmp_path, capsys):
    for name in ("queue5.yaml", "queue10.yaml"):
        (tmp_path / name).write_text((EXAMPLES / "replay" / "keda_queue.yaml").read_text())
    main(["compare", str(SCENARIO), "--spec", str(tmp_path / "queue5.yaml"), "--spec",
          str(tmp_path / "queue10.yaml"), "--out", str(tmp_path / "out"), "--duration", "60", "--no-bounds",
          "--no-plots", "--workers", "1", "--no-progress"])
    table = capsys.readouterr().out
    assert "\nllama-queue (queue5.yaml) | " in table and "\nllama-queue (queue10.yaml) | " in table
    names = [r["name"] for r in json.loads((tmp_path / "out" / "compare.json").read_text())["rows"]]
    assert names == ["llama-queue (queue5.yaml)", "llama-queue (queue10.yaml)"]


def test_report_shows_numbers_for_humans(tmp_path):
    # the table used to print raw values (0.022854, False): now percentages, ms, money, yes/NO
    from simulator.planner.compare_report import HEAD, table_rows, write_compare_outputs

    row = {"name": "a", "kind": "spec", "spec": "a.yaml", "attainment": 0.97312, "window_attainment": 0.5,
           "slo": {"ttft": 0.2994, "tpot": 0.022854}, "met": False, "gpu_hours": 0.0514612,
           "x_oracle": 1.3245, "cost": 0.504317, "cost_per_hour_at_peak": 39.2, "peak_replicas": 2,
           "scale_events": 3, "timeline": []}
    oracle = {**row, "name": "o", "kind": "oracle", "attainment": None, "window_attainment": None, "slo": {},
              "met": None, "x_oracle": 1.0, "scale_events": None}
    result = {"scenario": "s", "seed": 1, "currency": "EUR", "rows": [row, oracle]}
    cells = dict(zip(HEAD, table_rows(result)[0]))
    assert cells == {"row": "a", "attainment (requests)": "97.31%", "attainment (1-min windows)": "50.0%",
                     "SLO values at percentile": "ttft 299 ms, tpot 22.9 ms", "SLOs met": "NO",
                     "GPU-hours": "0.0515", "x oracle": "1.32x", "cost": "0.50 EUR",
                     "cost/h at peak": "39.20 EUR", "peak replicas": 2, "scale events": 3}
    assert table_rows(result)[1][1:5] == ["-", "-", None, "-"]
    write_compare_outputs(result, tmp_path, plots=False)
    html = (tmp_path / "report.html").read_text()
    assert "<td>ttft 299 ms, tpot 22.9 ms</td><td>NO</td><td>0.0515</td><td>1.32x</td>" in html
    for raw in ("0.022854", "0.2994", "False", "None", "0.504317"):
        assert raw not in html, raw


def test_plot_spans_the_workload_not_the_slowest_drain():
    # a row that drained for 2 h after a 30-minute workload used to stretch the x-axis to minute 150
    def row(name, end):
        return {"name": name, "kind": "spec", "timeline": [[t, 2, 5.0 if t < 1800 else 0.0]
                                                          for t in range(0, end + 1, 60)]}

    result = {"scenario": "s", "duration": 1800, "rows": [row("fast", 1900), row("slow", 9000)]}
    ax = replicas_figure(result).axes[0]
    assert ax.get_xlim() == (0, 30)
    assert any("to minute 150) not shown" in t.get_text() for t in ax.texts)
    result = {**result, "duration": None}  # a trace's run: the last arrival bounds it
    assert replicas_figure(result).axes[0].get_xlim() == (0, 29)
    result["rows"] = [row("fast", 1900)]
    assert len(replicas_figure({**result, "duration": 1900}).axes[0].texts) == 0  # nothing cut off
