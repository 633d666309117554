"""`slopilot replay` on the shipped examples, malformed series, and KEDA's null/NaN/error handling."""

import csv
import io
from pathlib import Path

import pytest

from autoscaler import load_spec, make_policy
from autoscaler.replay import replay
from autoscaler.series import read_series
from slopilot.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "replay"
CASES = ["keda_queue", "keda_queue_strict", "modifiers", "ratio", "slo_model"]


def run_cli(name: str, tmp_path: Path) -> list[dict]:
    out = tmp_path / f"{name}.csv"
    argv = [
        "replay",
        "--spec",
        str(EXAMPLES / f"{name}.yaml"),
        "--metrics",
        str(EXAMPLES / f"{name}.csv"),
        "-o",
        str(out),
    ]
    if name == "slo_model":
        argv += ["--step-model", str(EXAMPLES / "step_model.json")]
    assert main(argv) == 0
    return list(csv.DictReader(io.StringIO(out.read_text())))


@pytest.mark.parametrize("name", CASES)
def test_examples_reproduce_expected_decisions(name, tmp_path):
    got = run_cli(name, tmp_path)
    expected = list(csv.DictReader(io.StringIO((EXAMPLES / f"{name}.expected.csv").read_text())))
    assert got == expected
    assert list(got[0]) == ["time", "desired_replicas", "active", "reason"]


def _by_time(rows):
    return {r["time"]: (int(r["desired_replicas"]), r["active"] == "true") for r in rows}


def test_keda_queue_semantics(tmp_path):
    d = _by_time(run_cli("keda_queue", tmp_path))
    assert d["30"] == (0, False)  # 1 is not above activationThreshold 2 (strictly greater)
    assert d["60"] == (1, True)  # KEDA itself scales 0 -> 1
    assert d["90"][0] == 3  # HPA AverageValue: ceil(30 / 10)
    assert d["150"] == (6, False) and d["180"] == (6, False)  # empty and NaN count as 0 (ignoreNullValues)
    assert d["210"] == (6, False)  # query error without fallback: no change
    assert d["390"][0] == 6  # last active at 270 + cooldown 120 is not yet past
    assert d["420"] == (0, False)  # ... and now it is: back to minReplicaCount 0


def test_strict_nulls_are_errors_and_fallback_applies(tmp_path):
    rows = run_cli("keda_queue_strict", tmp_path)
    assert [int(r["desired_replicas"]) for r in rows] == [2, 2, 2, 2, 4, 6, 6]
    assert "errors: queue" in rows[2]["reason"]  # an empty result is an error when ignoreNullValues is false
    assert rows[0]["time"] == "2024-05-01T12:00:00Z"  # RFC 3339 in, RFC 3339 out


def test_defaults_to_stdout(capsys):
    assert (
        main(["replay", "--spec", str(EXAMPLES / "ratio.yaml"), "--metrics", str(EXAMPLES / "ratio.csv")])
        == 0
    )
    assert capsys.readouterr().out.startswith("time,desired_replicas,active,reason\n0,4,true,")


@pytest.mark.parametrize(
    "text,message",
    [
        ("time,queue\n0,1\n30,abc\n", "line 3, column queue: 'abc' is not a number"),
        ("time,queue\n0,1\n30\n", "line 3: 1 fields, the header has 2"),
        ("time,queue\n60,1\n30,2\n", "line 3, column time: goes backwards"),
        ("time,queue\nnoon,1\n", "line 2, column time: time 'noon' is neither seconds nor RFC 3339"),
        (
            "time,queue\n2024-05-01T12:00:00,1\n",
            "line 2, column time: time '2024-05-01T12:00:00' has no time zone",
        ),
        ("time,waiting\n0,1\n", "line 1: no column for trigger(s) queue"),
        ("stamp,queue\n0,1\n", "line 1: no 'time' column"),
        (
            "time,queue,current_replicas\n0,1,2.5\n",
            "line 2, column current_replicas: '2.5' must be a whole number",
        ),
        ("time,queue,bogus\n0,1,2\n", "line 1: unknown column 'bogus'"),
        ("time,queue\n", "no data rows"),
    ],
)
def test_malformed_series_rejected_with_line_number(text, message, tmp_path, capsys):
    series = tmp_path / "bad.csv"
    series.write_text(text)
    rc = main(["replay", "--spec", str(EXAMPLES / "keda_queue.yaml"), "--metrics", str(series)])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and str(series) in err


def test_invalid_spec_error_names_file_and_field(tmp_path, capsys):
    spec = tmp_path / "so.yaml"
    spec.write_text((EXAMPLES / "keda_queue.yaml").read_text().replace('threshold: "10"', "threshold: ten"))
    rc = main(["replay", "--spec", str(spec), "--metrics", str(EXAMPLES / "keda_queue.csv")])
    assert rc == 2
    assert f"{spec}:19: spec.triggers[0].metadata.threshold: must be a number" in capsys.readouterr().err


def test_ticks_use_latest_row_at_or_before():
    spec = load_spec((EXAMPLES / "keda_queue.yaml").read_text())
    rows, _ = read_series("time,queue\n0,0\n45,30\n100,30\n", ["queue"])
    out = replay(make_policy(spec), rows, 30.0, 0)
    assert [t for t, _ in out] == [0, 30, 60, 90]  # up to the last row's time
    assert [d.desired_replicas for _, d in out] == [0, 0, 1, 3]  # t=30 still sees row 0; t=60 sees row 45


def test_null_nan_inf_error_cells_parse():
    rows, _ = read_series("time,a,b\n0,,NaN\n1,error,+Inf\n2,-Inf,3\n", ["a", "b"])
    assert rows[0].metrics["a"] is None and rows[0].metrics["b"] != rows[0].metrics["b"]  # NaN
    assert rows[1].errors == {"a"} and rows[1].metrics["b"] == float("inf")
    assert rows[2].metrics == {"a": float("-inf"), "b": 3.0}


def test_series_is_read_from_an_iterator_of_lines():
    def lines():  # a generator: read once, line by line, as from an open file
        yield "time,queue\n"
        for t in range(0, 100, 10):
            yield f"{t},{t // 10}\n"

    rows, rfc = read_series(lines(), ["queue"])
    text_rows, _ = read_series("".join(lines()), ["queue"])
    assert not rfc and [r.time for r in rows] == list(range(0, 100, 10))
    assert [(r.line, r.metrics) for r in rows] == [(r.line, r.metrics) for r in text_rows]
