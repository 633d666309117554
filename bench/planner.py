"""The capacity planner's speed: `slopilot plan` on a shipped plan, in a child process, timed.

Runs `python -m slopilot.cli plan PLAN --out DIR --no-plots --no-progress` as a user would (the
default process pool: one worker per CPU), and reports its wall time, the CPU time of it and its
workers (the children's rusage), the simulations it ran and its answer, with the load average before
and after (the machine is shared: read the wall time with it; CPU is the fair comparison).

    .venv/bin/python bench/planner.py [--plan examples/plan_h100_a100.yaml] [--repeats 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PLAN = ROOT / "examples" / "plan_h100_a100.yaml"


def run_plan(plan: Path, workers: int | None) -> dict:
    """One `slopilot plan` in a child process: wall, CPU (user + system of it and its workers), plan.json."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "slopilot.cli", "plan", str(plan), "--out", out, "--no-plots",
                "--no-progress", *(["--workers", str(workers)] if workers else [])]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"slopilot plan {plan} failed ({done.returncode}): {done.stderr[-2000:]}")
        result = json.loads((Path(out) / "plan.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "simulations": result["simulations"], "answer": result["answer"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, default=PLAN)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workers", type=int, default=None, help="the plan's --workers (default: one per CPU)")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    runs = []
    for i in range(args.repeats):
        r = run_plan(args.plan, args.workers)
        runs.append(r)
        print(f"run {i + 1}: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU, {r['simulations']} "
              f"simulations; load average now {os.getloadavg()[0]:.1f}", flush=True)
    answers = {r["answer"]["text"] for r in runs}
    text = runs[-1]["answer"]["text"]
    print(f"answer{'' if len(answers) == 1 else ' (runs DIFFER)'}: {text}")
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    print(f"median of {args.repeats}: {wall:.0f} s wall, {cpu:.0f} s CPU; load average before "
          f"{load0[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    if args.json:
        from bench.pages import write_result

        plan = args.plan.resolve()
        name = plan.relative_to(ROOT) if plan.is_relative_to(ROOT) else args.plan
        pool = f"{args.workers} workers" if args.workers else "default pool"
        median = f", median of {args.repeats}" if args.repeats > 1 else ""
        write_result(args.json, ["run", "wall", "CPU (user + system, all processes)", "simulations",
                                 "result"],
                     [[f"`slopilot plan {name}`, {pool}{median}", f"{wall:.0f} s", f"{cpu:.0f} s",
                       runs[-1]["simulations"], text + ("" if len(answers) == 1 else " (answers differ)")]],
                     notes=[f"Load average {load0[0]:.1f} before the run, {os.getloadavg()[0]:.1f} after; on "
                            "a shared machine CPU time is the fair comparison."])
    return 0 if len(answers) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
