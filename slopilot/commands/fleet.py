"""`slopilot fleet up FLEET.yaml`: a local fleet of engines, a real Prometheus and the controller.

The all-in-one to try a policy on a laptop: engine replicas as processes (`serve --emulate MODEL` by
default) on free loopback ports, the Debian `prometheus` binary scraping them, and the controller
scaling the fleet with the FLEET.yaml's autoscaler spec, under the optional built-in load, with a
live dashboard. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run a local fleet of engines with Prometheus and the controller (fleet up FLEET.yaml)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from controlplane.settings import ControllerArgs

    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start the fleet, Prometheus, the controller and the load",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    up.add_argument("fleet", metavar="FLEET.yaml", help="the fleet (see examples/fleet_local.yaml)")
    up.add_argument("--out", "-o", default="out/fleet", help="run folder: decision log, logs, summary")
    up.add_argument("--duration", type=float, default=None,
                    help="seconds to run (default: until the built-in load ends, or Ctrl-C without one)")
    up.add_argument("--no-load", action="store_true", help="do not send the FLEET.yaml's built-in load")
    up.add_argument("--rate-window", type=float, default=ControllerArgs.window,
                    help="seconds of the rates the policy reads")
    up.add_argument("--no-dashboard", action="store_true", help="print one line per scale instead")
    up.add_argument("--overwrite", action="store_true",
                    help="replace an earlier run in --out (its decision logs, state and summary)")


def serve_flags() -> set[str]:
    """The flags `slopilot serve` takes (without dashes, underscores for hyphens): a fleet's engine keys."""
    from slopilot.commands import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    flags = {o[2:].replace("-", "_") for a in parser._actions for o in a.option_strings if o.startswith("--")}
    return flags - {"help", "version"}


def earlier_run(out: str) -> list[str]:
    """What an earlier run left in the run folder: its decision logs, its policy state, its summary."""
    folder = Path(out)
    if not folder.is_dir():
        return []
    names = ("decisions*.csv", "state", "summary.json", "requests.csv")
    return sorted({p.name for pattern in names for p in folder.glob(pattern)})


def clear_earlier_run(out: str) -> None:
    """Removes what an earlier run left in the run folder (earlier_run's files); other files stay."""
    import shutil

    for name in earlier_run(out):
        path = Path(out) / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def run(args: argparse.Namespace) -> int:
    from controlplane.fleet import load_fleet_config

    cfg = load_fleet_config(args.fleet, engine_flags=serve_flags(), check_model=True)
    earlier = earlier_run(args.out)
    if earlier and not args.overwrite:
        raise SystemExit(f"slopilot fleet up: error: --out {args.out} holds an earlier run "
                         f"({', '.join(earlier)}); "
                         "a new run would append to its decision log and resume its policy state: "
                         "give another --out, or --overwrite to replace it")
    clear_earlier_run(args.out)
    return run_fleet(cfg, args.out, args.duration, not args.no_load, args.rate_window, not args.no_dashboard)


def run_fleet(cfg, out: str, duration: float | None, with_load: bool, rate_window: float,
              dashboard: bool = True) -> int:
    """Runs the fleet until the load ends, `duration` passes or SIGINT/SIGTERM; writes the summary."""
    import json
    import signal
    import sys

    from rich.live import Live

    from controlplane.logs import setup_logging
    from controlplane.pdrun import make_run

    setup_logging("warning" if dashboard else "info")
    run = make_run(cfg, out, rate_window=rate_window, with_load=with_load)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: run.stopping.set())
    if cfg.pd is not None:
        scaler = {p.name: p.autoscaler.name if p.autoscaler else "fixed" for p in cfg.pd.pools().values()}
        pools = ", ".join(f"{p.name}: {p.replicas} replica(s) ({scaler[p.name]})"
                          for p in cfg.pd.pools().values())
        print(f"starting P/D fleet {cfg.name}: {pools}, the router in P/D mode (threshold {cfg.pd.threshold} "
              f"uncached tokens), Prometheus; run folder {out}", file=sys.stderr, flush=True)
    else:
        print(f"starting {cfg.name}: {cfg.replicas} replica(s), Prometheus, the controller "
              f"({cfg.autoscaler.kind} {cfg.autoscaler.name}); run folder {out}", file=sys.stderr, flush=True)
    if duration is None and (not with_load or cfg.load is None):
        print("no load and no --duration: runs until Ctrl-C", file=sys.stderr)
    with run:
        for part, url in run.urls().items():
            print(f"  {part}: {url}", file=sys.stderr, flush=True)
        if dashboard and sys.stdout.isatty():
            with Live(run.dashboard.render(), refresh_per_second=1, transient=False) as live:
                def tick():
                    run.dashboard.refresh()
                    live.update(run.dashboard.render())

                run.wait(duration, tick)
        else:
            run.wait(duration, run.dashboard.refresh)
    summary = run.write_summary()
    print(run.final_frame or "")
    shown = ("scale_events", "requests", "batch", "gpu_seconds")
    print(json.dumps({k: summary[k] for k in shown if k in summary}, indent=2))
    if "spec" in summary:
        print(f"wrote {out}/decisions.csv, summary.json, dashboard.txt; replay with: slopilot replay "
              f"--spec {out}/{summary['spec']} --metrics {out}/decisions.csv")
    else:
        print(f"wrote {out}/summary.json, dashboard.txt and each autoscaled pool's decisions-POOL.csv")
    return 0
