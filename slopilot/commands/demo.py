"""`slopilot demo --live` (what `make demo` runs) and `slopilot demo` (a simulated hour).

Live: about two minutes of a local fleet of emulated engines behind a real Prometheus, scaled by the
controller with a KEDA ScaledObject under a load ramp up and back down (examples/fleet_demo.yaml);
DIR gets the decision log, the spec it ran, summary.json and the dashboard's last frame, and the
decision log is replayed through `slopilot replay`'s code to check that it gives the same decisions.

Simulated: an hour of Azure-like conversation traffic on an H100 fleet. The Azure trace itself is
not shipped, so its published statistics drive a generated workload
(examples/azure_conv_h100.yaml: 5.5 req/s, inter-arrival CV 1.09, lognormal prompt and output
lengths fitted to their means and medians), served by 8 Llama-2-70B TP4 replicas with the
calibrated H100 latency model; the report (CSV, JSON, PNG plots, HTML) goes to ./out/demo.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "--live runs a local fleet under the controller, else a simulated hour"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCENARIO = EXAMPLES / "azure_conv_h100.yaml"
FLEET = EXAMPLES / "fleet_demo.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "the user guide: docs/guide.md"
    p.add_argument("--live", action="store_true",
                   help="run the live demo: engines, Prometheus and the controller, about 2 minutes")
    p.add_argument("--fleet", default=str(FLEET), help="with --live: the FLEET.yaml (default: the demo's)")
    p.add_argument("--out", "-o", default="out/demo", help="report folder (default: out/demo)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default 3600)")
    p.add_argument("--scenario", default=str(SCENARIO), help="scenario file (default: the Azure-like one)")


def run(args: argparse.Namespace) -> int:
    if args.live:
        return run_live(args)
    import sys
    import time

    from simulator.report import summary_lines
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    sc = load_scenario(args.scenario, duration=args.duration)
    t = time.perf_counter()
    res = simulate(sc, args.out, seed=args.seed, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t
    s = res.summary
    print(f"simulated {s['simulated_until']:.0f} s of {sc.name} in {wall:.1f} s wall")
    for line in summary_lines(s):
        print(line)
    print(f"report: {Path(args.out) / 'report.html'} (plots: replicas_vs_load.png, latency_over_time.png, "
          "latency_cdfs.png, queue_and_kv.png)")
    return 0


def run_live(args: argparse.Namespace) -> int:
    import csv
    import sys

    from autoscaler.replay import replay
    from autoscaler.series import read_series
    from autoscaler.spec import load_spec, make_policy
    from controlplane.fleet import load_fleet_config
    from slopilot.commands.fleet import clear_earlier_run, run_fleet

    cfg = load_fleet_config(args.fleet)
    out = Path(args.out)
    # the demo's folder is its own: a second demo replaces the first (not appended to its decision log)
    clear_earlier_run(str(out))
    rc = run_fleet(cfg, str(out), None, True, rate_window=20.0, dashboard=sys.stdout.isatty())
    # the decision log replays to the same decisions (the check `slopilot replay` does)
    spec_path = out / f"{cfg.autoscaler.name}.yaml"
    spec = load_spec(spec_path.read_text(), str(spec_path))
    with open(out / "decisions.csv", newline="") as f:
        logged = [(r["desired_replicas"], r["active"], r["reason"]) for r in csv.DictReader(f)]
    with open(out / "decisions.csv", newline="") as f:
        rows, _ = read_series(f, [t.name for t in spec.triggers], str(out / "decisions.csv"))
    decisions = replay(make_policy(spec), rows, spec.polling_interval, spec.min_replicas, at_rows=True)
    again = [(str(d.desired_replicas), "true" if d.active else "false", d.reason) for _, d in decisions]
    same = sum(a == b for a, b in zip(logged, again))
    print(f"replayed {out / 'decisions.csv'}: {same}/{len(logged)} decisions identical")
    return rc if same == len(logged) == len(again) else 1
