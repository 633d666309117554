"""`slopilot simulate SCENARIO.yaml --out DIR [--seed N]`."""

from __future__ import annotations

import argparse
import sys

HELP = "simulate a fleet of engine replicas under a workload and an autoscaling policy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--out", "-o", required=True, help="output folder (requests.csv, timeline.csv, ...)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument("--duration", type=float, default=None, help="override the scenario's duration (s)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--step-by-step", action="store_true", help="disable the closed-form fast path (slow; for checking)"
    )


def run(args: argparse.Namespace) -> int:
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    sc = load_scenario(args.scenario)
    if args.duration is not None:
        sc.duration = args.duration
    res = simulate(
        sc,
        args.out,
        seed=args.seed,
        progress=not args.no_progress and sys.stderr.isatty(),
        fast=not args.step_by_step,
        plots=not args.no_plots,
    )
    s = res.summary
    nan = float("nan")
    ttft, tpot = s["latency"]["ttft"], s["latency"]["tpot"]
    print(f"{s['requests']['ok']}/{s['requests']['arrived']} requests ok")
    print(f"TTFT p50/p90 {ttft.get('p50', nan):.3f}/{ttft.get('p90', nan):.3f} s; "
          f"TPOT p50/p90 {tpot.get('p50', nan):.4f}/{tpot.get('p90', nan):.4f} s")
    if s["slo_attainment_joint"] is not None:
        print(f"SLO attainment (all SLOs): {s['slo_attainment_joint']:.4f}; "
              f"goodput {s['goodput_rps']:.3f} req/s")
    print(f"replica-hours {s['replica_hours']:.3f}, cost {s['cost']:.2f}, scale events {s['scale_events']}")
    print(f"wrote {args.out}/requests.csv, timeline.csv, summary.json, report.html")
    return 0
