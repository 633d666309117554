"""`slopilot simulate SCENARIO.yaml --out DIR [--seed N] [--fail-on-slo-miss] [--export-series]`.

--export-series also writes DIR/series.om: every scraped series (and recording rule output) of the
run, with timestamps, as OpenMetrics text: `slopilot query DIR ...` reads it, and
`promtool tsdb create-blocks-from openmetrics DIR/series.om DATA` loads it into a Prometheus TSDB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

HELP = "simulate a fleet of engine replicas under a workload and an autoscaling policy"
GUIDE = ("scenario reference and examples: docs/guide.md (Plan capacity with the simulator) and "
         "docs/inputs.md; exit status 1 with --fail-on-slo-miss when an SLO was missed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = GUIDE
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--out", "-o", required=True, help="output folder (requests.csv, timeline.csv, ...)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument("--duration", type=float, default=None, help="override the scenario's duration (s)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--step-by-step", action="store_true", help="disable the closed-form fast path (slow; for checking)"
    )
    parser.add_argument("--export-series", action="store_true",
                        help="also write DIR/series.om, the run's scraped series in OpenMetrics text "
                        "(for `slopilot query`, or promtool tsdb create-blocks-from openmetrics)")
    parser.add_argument("--fail-on-slo-miss", action="store_true",
                        help="exit with status 1 when the run missed any of the scenario's SLOs (for CI)")


def export_series(store, path: Path) -> None:
    """The run's series as OpenMetrics text (written aside, then moved into place)."""
    from promql.openmetrics import write_openmetrics

    part = path.with_name(f".{path.name}.part")
    try:
        with part.open("w", encoding="utf-8") as f:
            write_openmetrics(f, store.families())
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from simulator.lint import lint_file
    from simulator.metrics import keep_all_samples
    from simulator.report import slos_missed, summary_lines
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    sc = load_scenario(args.scenario, duration=args.duration)
    for w in lint_file(args.scenario):
        print(f"warning: {w}", file=sys.stderr)
    with keep_all_samples() if args.export_series else contextlib.nullcontext():
        res = simulate(
            sc,
            args.out,
            seed=args.seed,
            progress=False if args.no_progress else "bar" if sys.stderr.isatty() else "lines",
            fast=not args.step_by_step,
            plots=not args.no_plots,
        )
    if args.export_series:
        export_series(res.fleet.store, Path(args.out) / "series.om")
    for line in summary_lines(res.summary):
        print(line)
    print(f"wrote {args.out}/requests.csv, timeline.csv, summary.json, report.html"
          + ("" if args.no_plots else " and the plots") + (", series.om" if args.export_series else ""))
    return 1 if args.fail_on_slo_miss and slos_missed(res.summary) else 0
