"""`slopilot compare SCENARIO.yaml --spec A.yaml --spec B.yaml ... --out DIR [--fail-on-slo-miss]`."""

from __future__ import annotations

import argparse
import sys

HELP = "one workload under several policies, beside the static fleet for its peak and the oracle bound"
GUIDE = ("each --spec replaces the scenario's autoscalers, as `autoscaler: {spec: FILE}` would. Exit "
         "status: 0 done; 1 with --fail-on-slo-miss when a policy missed an SLO; 2 bad input")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = GUIDE
    parser.add_argument("scenario", help="scenario YAML file (its workload, pools and SLOs)")
    parser.add_argument("--spec", action="append", default=[], required=True,
                        help="a policy spec (KEDA ScaledObject or InferenceAutoscaler); repeat for more")
    parser.add_argument("--out", "-o", required=True, help="output folder (compare.json, report.html, ...)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument("--duration", type=float, default=None, help="override the scenario's duration (s)")
    parser.add_argument("--capacity-duration", type=float, default=None,
                        help="seconds of each run sizing the static fleet (default: the planner's)")
    parser.add_argument("--no-bounds", action="store_true", help="skip the static peak and oracle rows")
    parser.add_argument("--workers", type=int, default=None,
                        help="simulations at once on this machine (default: one per CPU; 1: in this process)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run on a Ray cluster: its address, 'auto', or 'local' (needs the ray package)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--fail-on-slo-miss", action="store_true",
                        help="exit with status 1 when any policy missed an SLO (for CI)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simulator.planner.compare import run_compare
    from simulator.planner.compare_report import HEAD, table_rows, write_compare_outputs
    from simulator.planner.plan import SEARCH_DEFAULTS
    from simulator.planner.progress import SweepProgress
    from simulator.planner.sweep import make_runner

    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.capacity_duration is not None and not 0 < args.capacity_duration <= 86400:
        raise ValueError(f"--capacity-duration must be in (0, 86400] s, got {args.capacity_duration}")
    runner = make_runner(args.workers, args.ray)
    try:
        show = False if args.no_progress else True if sys.stderr.isatty() else "lines"
        with SweepProgress(show) as progress:
            result = run_compare(args.scenario, args.spec, runner, args.duration, args.seed,
                                 args.capacity_duration or SEARCH_DEFAULTS["duration"], not args.no_bounds,
                                 progress)
    finally:
        runner.close()
    written = write_compare_outputs(result, Path(args.out), plots=not args.no_plots)
    for r in result["rows"]:  # a trigger that scaled on nothing makes its row meaningless: say so first
        for w in r.get("unmatched_triggers", []):
            print(f"warning: {r['name']}: {w['message']}")
    print(" | ".join(HEAD))
    for row in table_rows(result):
        print(" | ".join("-" if v is None else f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row))
    if result.get("bounds"):
        print(f"no static or oracle rows: {result['bounds']}")
    print(f"wrote {args.out}/" + ", ".join(written))
    missed = [r["name"] for r in result["rows"] if r["kind"] == "spec" and not r["met"]]
    return 1 if args.fail_on_slo_miss and missed else 0
