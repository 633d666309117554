"""`slopilot replay --spec SPEC.yaml --metrics SERIES.csv [-o OUT.csv]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "replay recorded metric series through a ScaledObject / InferenceAutoscaler policy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="KEDA ScaledObject or InferenceAutoscaler YAML")
    parser.add_argument("--metrics", required=True, help="series CSV: time, one column per trigger, ...")
    parser.add_argument("-o", "--output", help="write the decisions CSV here (default: stdout)")
    parser.add_argument(
        "--initial-replicas",
        type=int,
        default=None,
        help="replicas before the first row when the series has no current_replicas "
        "(default: the spec's minimum)",
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="override the spec's polling interval (s)"
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument(
        "--step-model",
        help="JSON step-time coefficients for sloModel specs "
        "(base_ms, prefill_token_ms, decode_seq_ms, decode_context_token_ms)",
    )
    model.add_argument(
        "--latency-model",
        metavar="NAME_OR_JSON",
        help="step-time model for sloModel specs: a shipped model name or a calibrated JSON "
        "(what `slopilot control --latency-model` took)",
    )


def run(args: argparse.Namespace) -> int:
    from autoscaler.replay import LinearStepModel, read_series, replay, to_csv
    from autoscaler.spec import load_spec, make_policy

    spec_path, series_path = Path(args.spec), Path(args.metrics)
    spec = load_spec(spec_path.read_text(), path=str(spec_path))  # errors name the file, line and field
    model = None
    if args.step_model:
        try:
            model = LinearStepModel(json.loads(Path(args.step_model).read_text()), args.step_model)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{args.step_model}: not valid JSON: {exc}") from None
    elif args.latency_model:
        from simulator.latency import load_latency_model

        model = load_latency_model(args.latency_model)
    policy = make_policy(spec, latency_model=model)
    with series_path.open(newline="") as lines:
        header = lines.readline()
        lines.seek(0)
        rows, rfc = read_series(lines, [t.name for t in spec.triggers], str(series_path))
    # a decision log of `slopilot control` is replayed at its own rows' times
    at_rows = "desired_replicas" in [h.strip() for h in header.split(",")]
    initial = spec.min_replicas if args.initial_replicas is None else args.initial_replicas
    results = replay(policy, rows, args.interval or spec.polling_interval, initial, at_rows=at_rows)
    text = to_csv(results, rfc)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
