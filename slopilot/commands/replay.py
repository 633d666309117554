"""`slopilot replay --spec SPEC.yaml --metrics SERIES.csv [-o OUT.csv]`, or with
`--prometheus URL --start S --end E [--step D]` in place of --metrics: the series is recorded from
Prometheus first (as `slopilot record` does) and replayed at once.

The series is streamed: each decision is written as soon as the rows it needs are read, so a series
of millions of rows replays in constant memory. With -o the file appears only when the whole series
replayed (a bad line leaves no half-written file).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import os
import sys
from pathlib import Path

HELP = "replay recorded metric series through a ScaledObject / InferenceAutoscaler policy"
GUIDE = "series format and examples: docs/guide.md (Test a ScaledObject on recorded metrics)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = GUIDE
    parser.add_argument("--spec", required=True, help="KEDA ScaledObject or InferenceAutoscaler YAML")
    parser.add_argument("--metrics", help="series CSV: time, one column per trigger, ...")
    parser.add_argument("--prometheus", help="record the series from this Prometheus (base URL) over "
                        "--start..--end instead of reading --metrics")
    from slopilot.commands.record import add_range_arguments

    add_range_arguments(parser, required=False)
    parser.add_argument("-o", "--output", help="write the decisions CSV here (default: stdout)")
    parser.add_argument(
        "--initial-replicas",
        type=int,
        default=None,
        help="replicas before the first row when the series has no current_replicas "
        "(default: the spec's minimum)",
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="override the spec's polling interval (s, >= 0.001)"
    )
    parser.add_argument(
        "--step-model",
        help="step-time model for sloModel specs: a latency model from `slopilot calibrate`, a shipped "
        "model's name (e.g. h100-llama2-70b-tp4), or JSON coefficients "
        "(base_ms, prefill_token_ms, decode_seq_ms, decode_context_token_ms)",
    )


def load_step_model(value: str):
    """--step-model: a calibrated or shipped latency model, or the four linear coefficients."""
    from autoscaler.replay import LinearStepModel
    from simulator.latency import is_derived, is_model_path, list_named, load_latency_model
    from simulator.latency.model import FORMAT, LatencyModel

    flag = f"--step-model {value}"
    if not is_model_path(value) and not Path(value).is_file():
        if value not in list_named() and not is_derived(value):
            raise ValueError(f"{flag}: no such file or shipped model (shipped: {', '.join(list_named())})")
        return load_latency_model(value)
    path = Path(value)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{flag}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag}: not a JSON file ({exc})") from None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        try:
            return LatencyModel.from_dict(data, flag)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
    if isinstance(data, dict) and any(k in data for k in LinearStepModel.KEYS):
        return LinearStepModel(data, flag)
    raise ValueError(f"{flag}: neither a latency model (`slopilot calibrate` output, format {FORMAT}) nor "
                     f"linear coefficients ({', '.join(LinearStepModel.KEYS)})")


def run(args: argparse.Namespace) -> int:
    from autoscaler.replay import check_interval, replay_iter
    from autoscaler.series import Series
    from autoscaler.spec import load_spec, make_policy

    if (args.metrics is None) == (args.prometheus is None):
        raise ValueError("give --metrics SERIES.csv, or --prometheus URL --start S --end E")
    if args.prometheus is None and (args.start or args.end or args.step):
        raise ValueError("--start, --end and --step go with --prometheus")
    if args.prometheus is not None and not (args.start and args.end):
        raise ValueError("--prometheus needs --start and --end")
    spec_path = Path(args.spec)
    series_path = Path(args.metrics or f"{args.prometheus} {args.start}..{args.end}")
    try:
        spec = load_spec(spec_path.read_text(), str(spec_path))
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith(str(spec_path)) else f"{spec_path}: {text}") from None
    from autoscaler.lint import spec_warnings
    from autoscaler.yamlfile import parse

    for w in spec_warnings(parse(spec_path.read_text(), str(spec_path))):
        print(f"warning: {w}", file=sys.stderr)
    if args.interval is not None:
        interval = check_interval(args.interval, "--interval")
    else:
        interval = check_interval(spec.polling_interval, f"{spec_path}: the spec's polling interval")
    model = load_step_model(args.step_model) if args.step_model else None
    if spec.needs_latency_model and model is None:
        raise ValueError(f"{spec_path}: a {spec.policy_type} spec needs --step-model (a latency model from "
                         "`slopilot calibrate`, or a shipped model's name)")
    try:
        policy = make_policy(spec, latency_model=model)
    except ValueError as exc:
        raise ValueError(f"{spec_path}: {exc}") from None
    initial = spec.min_replicas if args.initial_replicas is None else args.initial_replicas
    if args.prometheus is not None:
        from slopilot.commands.record import record, time_range

        start, end, step, rfc = time_range(args, spec)
        source = contextlib.nullcontext(io.StringIO(record(args.prometheus, spec, start, end, step, rfc)))
    else:
        source = series_path.open("rb")
    with source as lines:
        series = Series(lines, [t.name for t in spec.triggers], str(series_path))
        decisions = replay_iter(policy, series, interval, initial, at_rows=series.decision_log,
                                name=str(series_path))
        first = next(decisions, None)  # the header and the first rows are checked before any output
        if first is None:
            raise ValueError(f"{series_path}: no data rows")
        decisions = itertools.chain([first], decisions)
        if not args.output:
            _write(sys.stdout, decisions, series.rfc3339)
            return 0
        out = Path(args.output)
        part = out.with_name(f".{out.name}.part")
        try:
            with part.open("w", newline="") as f:
                _write(f, decisions, series.rfc3339)
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)
    return 0


def _write(f, decisions, rfc3339: bool) -> None:
    from autoscaler.replay import DECISION_COLUMNS, decision_row

    w = csv.writer(f, lineterminator="\n")
    w.writerow(DECISION_COLUMNS)
    for t, d in decisions:
        w.writerow(decision_row(t, d, rfc3339))
