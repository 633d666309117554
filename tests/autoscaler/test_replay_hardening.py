"""`slopilot replay` on hostile series: bad times, intervals and encodings get an error naming the
file and line (or the flag); the series streams in bounded memory; --step-model takes every model form."""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.replay import MAX_TICKS, replay_iter
from autoscaler.series import MAX_REPLICAS, Row, Series
from autoscaler.spec import load_spec, make_policy
from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "replay"
KEDA = EXAMPLES / "keda_queue.yaml"


def replay_cli(series: Path, *extra: str, spec: Path = KEDA) -> int:
    return main(["replay", "--spec", str(spec), "--metrics", str(series), *extra])


@pytest.mark.parametrize(
    "data,message",
    [
        (b"time,queue\n0,1\nnan,2\n", "line 3, column time: time 'nan' is not a finite number"),
        (b"time,queue\n0,1\n30,1\nNaN,2\n", "line 4, column time: time 'NaN' is not a finite"),
        (b"time,queue\ninf,1\n", "line 2, column time: time 'inf' is not a finite"),
        (b"time,queue\n-Infinity,1\n", "line 2, column time: time '-Infinity' is not a finite"),
        (b"time,queue\n0,1\n1e300,1\n", "line 3, column time: time '1e300' is out of range"),
        (b"time,queue\n1764763200000,1\n", "out of range (at most 253402300799 s"),  # milliseconds
        (b"time,queue\n0,1\n1e9,1\n", f"line 3: time 1e+09 is more than {MAX_TICKS} polling intervals"),
        (b"\xef\xbb\xbftime,queue\n0,1\n", "line 1: starts with a byte-order mark"),
        (b"\xff\xfet\x00i\x00m\x00e\x00\n\x00", "line 1: not UTF-8 text"),  # UTF-16
        (b"time,queue\n0,1\n30,\xe9\n", "line 3: not UTF-8 text (byte 4 of the line is b'\\xe9')"),
        (b"time,queue\n0,1\n30,\xc3\n60,2\n", "line 3: not UTF-8 text"),
        (b"time,queue\n0,1\x00\n", "line 2, column queue: '1\\x00' is not a number"),
        (b"time,queue\n0," + b"1" * (1 << 20) + b"\n", "line 2: longer than 1048576 bytes"),
        (b"time,queue,queue\n0,1,1\n", "line 1: column(s) queue given twice"),
        (b"time,queue,ttft_pxx\n0,1,1\n", "line 1: column 'ttft_pxx' must look like ttft_p90"),
        (b"time,queue,ttft_p0\n0,1,1\n", "line 1: column 'ttft_p0' must look like ttft_p90"),
        (b"time,queue,current_replicas\n0,1,1e9\n", f"must be a whole number from 0 to {MAX_REPLICAS}"),
        (b"time,queue,current_replicas\n0,1,-1\n", "line 2, column current_replicas: '-1' must be a whole"),
        (b"time,queue,ready_replicas\n0,1,inf\n", "column ready_replicas: 'inf' must be a whole number"),
    ],
)
def test_hostile_series_get_a_clear_error(data, message, tmp_path, capsys):
    series = tmp_path / "bad.csv"
    series.write_bytes(data)
    out = tmp_path / "decisions.csv"
    assert replay_cli(series, "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert message in err and str(series) in err, err
    assert not out.exists() and not list(tmp_path.glob(".*part"))  # nothing half-written


@pytest.mark.parametrize("value", ["0", "-30", "nan", "inf", "0.0001", "1e-9"])
def test_bad_interval_flag_is_named(value, tmp_path, capsys):
    assert replay_cli(EXAMPLES / "keda_queue.csv", f"--interval={value}") == 2
    err = capsys.readouterr().err
    assert "--interval" in err and "must be a finite number of seconds >= 0.001" in err


@pytest.mark.parametrize("value", ["0.0001", "0.0000001"])
def test_sub_millisecond_polling_interval_in_spec_is_refused(value, tmp_path, capsys):
    spec = tmp_path / "ratio.yaml"
    spec.write_text((EXAMPLES / "ratio.yaml").read_text().replace("pollingInterval: 15",
                                                                    f"pollingInterval: {value}"))
    assert f"pollingInterval: {value}" in spec.read_text()
    assert replay_cli(EXAMPLES / "ratio.csv", spec=spec) == 2
    err = capsys.readouterr().err
    assert f"{spec}: the spec's polling interval" in err and ">= 0.001" in err


def test_rfc3339_times_keep_working_near_the_limits(tmp_path, capsys):
    series = tmp_path / "far.csv"
    series.write_text("time,queue\n9999-12-31T23:58:00Z,20\n9999-12-31T23:59:00Z,20\n")
    assert replay_cli(series) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("9999-12-31T23:58:00Z,1,true")


# ---- streaming ----------------------------------------------------------------------------------


def test_decisions_come_before_the_series_ends():
    policy = make_policy(load_spec(KEDA.read_text()))

    def endless():  # a series that never ends: only a streaming replay can answer at all
        for i in itertools.count():
            yield Row(i + 2, 30.0 * i, {"queue": 40.0})

    first = list(itertools.islice(replay_iter(policy, endless(), 30.0, 0), 5))
    assert [t for t, _ in first] == [0, 30, 60, 90, 120]
    assert [d.desired_replicas for _, d in first[:2]] == [1, 4]  # KEDA activates, then its HPA


def test_series_reads_lines_lazily():
    consumed = []

    def lines():
        yield "time,queue\n"
        for i in range(10**9):
            consumed.append(i)
            yield f"{i},1\n"

    rows = iter(Series(lines(), ["queue"]))
    assert [next(rows).time for _ in range(3)] == [0, 1, 2]
    assert len(consumed) <= 4


def _peak_rss_mb(rows: int, tmp_path: Path) -> float:
    series = tmp_path / f"s{rows}.csv"
    with series.open("w") as f:
        f.write("time,queue\n")
        f.writelines(f"{i * 5},{i % 50}\n" for i in range(rows))
    argv = [sys.executable, "-m", "slopilot.cli", "replay", "--spec", str(KEDA), "--metrics", str(series),
            "--interval", "600", "-o", str(tmp_path / f"o{rows}.csv")]
    # Linux counts a forked child's memory before its exec in its peak: start the replay from a small
    # process, not from this (large) test process
    out = subprocess.run([sys.executable, "-c", MEASURE, *argv], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


MEASURE = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
sys.exit(os.waitstatus_to_exitcode(status) or print(usage.ru_maxrss / 1024))
"""


def test_memory_does_not_grow_with_the_series(tmp_path):
    small, large = _peak_rss_mb(10_000, tmp_path), _peak_rss_mb(300_000, tmp_path)
    assert large < 200
    assert large - small < 10, (small, large)  # 30x the rows, the same memory


def test_a_decision_log_replays_at_its_rows_through_the_cli(tmp_path, capsys):
    log = tmp_path / "decisions.csv"
    log.write_text("time,queue,current_replicas,desired_replicas,active,reason,scale_error\n"
                   "0.5,40,1,4,true,x,\n17.25,error,4,4,false,x,boom\n40.125,0,4,4,false,x,\n")
    assert replay_cli(log) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in out[1:]] == ["0.5", "17.25", "40.125"]
    assert "errors: queue" in out[2]


# ---- --step-model -------------------------------------------------------------------------------


def _slo_model_replay(model: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "d.csv"
    rc = main(["replay", "--spec", str(EXAMPLES / "slo_model.yaml"), "--metrics",
               str(EXAMPLES / "slo_model.csv"), "--step-model", model, "-o", str(out)])
    assert rc == 0
    return out.read_text().splitlines()


def test_step_model_takes_coefficients_calibrated_models_and_shipped_names(tmp_path):
    from simulator.latency import load_latency_model

    linear = _slo_model_replay(str(EXAMPLES / "step_model.json"), tmp_path)
    assert linear == (EXAMPLES / "slo_model.expected.csv").read_text().splitlines()
    shipped = _slo_model_replay("h100-llama2-70b-tp4", tmp_path)
    calibrated = tmp_path / "calibrated.json"  # what `slopilot calibrate -o` writes
    load_latency_model("h100-llama2-70b-tp4").save(calibrated)
    assert _slo_model_replay(str(calibrated), tmp_path) == shipped
    assert all("sloModel: provision" in line for line in shipped[1:])


@pytest.mark.parametrize(
    "content,value,message",
    [
        (None, "no-such-model", "--step-model no-such-model: no such file or shipped model"),
        (None, "missing/m.json", "--step-model missing/m.json: no such file"),
        ("{not json", "bad.json", "not a JSON file"),
        ('{"format": "x"}', "other.json", "neither a latency model"),
        ('{"base_ms": "fast"}', "coeffs.json", "base_ms must be a number >= 0"),
        ('{"base_ms": 1, "prefill_token_ms": -1, "decode_seq_ms": 0, "decode_context_token_ms": 0}',
         "neg.json", "prefill_token_ms must be a number >= 0"),
        ('[1, 2]', "list.json", "neither a latency model"),
    ],
)
def test_step_model_errors_name_the_flag(content, value, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        Path(value).write_text(content)
    rc = main(["replay", "--spec", str(EXAMPLES / "slo_model.yaml"), "--metrics",
               str(EXAMPLES / "slo_model.csv"), "--step-model", value])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--step-model" in err and message in err, err


def test_slo_model_spec_without_step_model_names_the_flag(capsys):
    rc = main(["replay", "--spec", str(EXAMPLES / "slo_model.yaml"), "--metrics",
               str(EXAMPLES / "slo_model.csv")])
    assert rc == 2
    assert "needs --step-model" in capsys.readouterr().err
