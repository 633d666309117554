"""`slopilot demo` (what `make demo` runs): an hour of Azure-like conversation traffic on an H100 fleet.

The Azure trace itself is not shipped, so its published statistics drive a generated workload
(examples/azure_conv_h100.yaml: 5.5 req/s, inter-arrival CV 1.09, lognormal prompt and output
lengths fitted to their means and medians), served by 8 Llama-2-70B TP4 replicas with the
calibrated H100 latency model; the report (CSV, JSON, PNG plots, HTML) goes to ./out/demo.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "simulate an hour of Azure-like conversation traffic on an H100 fleet and write the report"
SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "azure_conv_h100.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", default="out/demo", help="report folder (default: out/demo)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default 3600)")
    p.add_argument("--scenario", default=str(SCENARIO), help="scenario file (default: the Azure-like one)")


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from simulator.run import simulate
    from simulator.scenario import load_scenario

    sc = load_scenario(args.scenario)
    if args.duration is not None:
        sc.duration = args.duration
    t = time.perf_counter()
    res = simulate(sc, args.out, seed=args.seed, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t
    s = res.summary
    lat = s["latency"]
    print(f"simulated {s['simulated_until']:.0f} s of {sc.name} in {wall:.1f} s wall")
    print(f"requests: {s['requests']['ok']}/{s['requests']['arrived']} ok, "
          f"throughput {s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:.0f} output tokens/s")
    for k in ("ttft", "tpot", "e2e"):
        q = lat[k]
        print(f"{k.upper():5s} p50 {q['p50']:.3f} s  p90 {q['p90']:.3f} s  p99 {q['p99']:.3f} s")
    for name, v in s["slo"].items():
        print(f"SLO {name} p{v['percentile']:g} <= {v['threshold']} s: {v['value_at_percentile']:.3f} s "
              f"({'met' if v['met'] else 'MISSED'}), {100 * v['attainment']:.2f}% of requests within")
    print(f"goodput {s['goodput_rps']:.2f} req/s; {s['replica_hours']:.1f} replica-hours, "
          f"cost {s['cost']:.0f}")
    print(f"report: {Path(args.out) / 'report.html'} (plots: replicas_vs_load.png, latency_over_time.png, "
          "latency_cdfs.png)")
    return 0
