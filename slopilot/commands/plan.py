"""`slopilot plan PLAN.yaml --out DIR [--workers N | --ray ADDRESS] [--fail-on-slo-miss]`."""

from __future__ import annotations

import argparse
import sys

HELP = "find the cheapest fleet that meets the SLOs: capacity per replica, static and autoscaled fleets"
GUIDE = ("plan file: examples/plan_h100_a100.yaml and the README's capacity planning section. Exit "
         "status: 0 done; 1 with --fail-on-slo-miss when no candidate meets every SLO; 2 bad input")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = GUIDE
    parser.add_argument("plan", help="plan YAML file")
    parser.add_argument("--out", "-o", required=True, help="output folder (plan.json, report.html, ...)")
    parser.add_argument("--workers", type=int, default=None,
                        help="simulations at once on this machine (default: one per CPU; 1: in this process)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run the simulations on a Ray cluster: its address, 'auto', or 'local' to "
                             "start one here (needs the ray package)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--fail-on-slo-miss", action="store_true",
                        help="exit with status 1 when no candidate meets every SLO (for CI)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simulator.latency.loader import derived_error_note
    from simulator.planner.plan import load_plan
    from simulator.planner.progress import SweepProgress
    from simulator.planner.rank import money
    from simulator.planner.report import write_plan_outputs
    from simulator.planner.stages import run_plan
    from simulator.planner.sweep import make_runner

    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    plan = load_plan(args.plan)
    from simulator.lint import lint_file

    for w in lint_file(args.plan):
        print(f"warning: {w}", file=sys.stderr)
    runner = make_runner(args.workers, args.ray)
    try:
        show = False if args.no_progress else True if sys.stderr.isatty() else "lines"
        with SweepProgress(show) as progress:
            result = run_plan(plan, runner, progress)
            pd = run_pd(plan, result, runner, progress) if plan.pd else None
    finally:
        runner.close()
    note = derived_error_note([c.deployment.pool["latency_model"] for c in plan.candidates])
    if note:  # the derived models' held-out error, beside the answer (printed, plan.json, report.html)
        result["answer"]["text"] += " " + note
    written = write_plan_outputs(plan, result, Path(args.out), plots=not args.no_plots)
    cur = result["currency"]
    print(result["answer"]["text"])
    print(f"{len(plan.candidates)} candidates, {len(plan.policies)} policies, "
          f"{result['simulations']} simulations.")
    for i, o in enumerate(result["ranking"][:10]):
        att = "-" if o["attainment"] is None else f"{100 * o['attainment']:.2f}%"
        static = "static (re-checked)" if o.get("rechecked") else "static (peak)"
        print(f"{i + 1:3d}. {o['candidate']:<40s} {o['policy'] or static:<24s} "
              f"{money(o['cost_per_day'], cur):>16s}/day  {att:>8s}  {'met' if o['met'] else 'MISSED'}")
    for bad in result.get("invalid", []):
        print(f"invalid: {bad['candidate']} {bad['policy']}: {bad['reason']}")
    if pd is not None:
        written += write_pd(pd, result["currency"], Path(args.out))
    print(f"wrote {args.out}/" + ", ".join(written) + " and scenarios/")
    return 1 if args.fail_on_slo_miss and not result["answer"]["met"] else 0


def run_pd(plan, result: dict, runner, progress) -> dict:
    """The P:D search (simulator.planner.pd_plan) at the plan's load levels; prints its table."""
    from simulator.planner.pd_plan import check, pd_plan_task, role_candidates, table
    from simulator.planner.sweep import drive

    check(plan)
    _, dec = role_candidates(plan)
    entry = next(e for e in result["candidates"] if e["name"] == dec.name)
    guess = entry["capacity"]["rps"] or plan.search["start_rate"]
    if progress is not None:
        progress.stage("aggregated and P/D fleets at each load level")
    pd = drive({"pd": pd_plan_task(plan, result["workload"]["peak_rps"], guess)}, runner, progress)["pd"]
    print(table(pd, result["currency"]))
    return pd


def write_pd(pd: dict, currency: str, out) -> list[str]:
    import json

    from simulator.planner.pd_plan import table

    out.mkdir(parents=True, exist_ok=True)
    (out / "pd.json").write_text(json.dumps(pd, indent=2, sort_keys=True) + "\n")
    (out / "pd.md").write_text(table(pd, currency) + "\n")
    return ["pd.json", "pd.md"]
