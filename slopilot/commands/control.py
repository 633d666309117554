"""`slopilot control --spec FILE_OR_DIR ...`: run ScaledObjects and InferenceAutoscalers live.

Metrics come from Prometheus (`--prometheus`, else each trigger's serverAddress) or straight from the
engines' /metrics pages (`--scrape URL ...`). The scale goes to a command (`--scale-command`), or
nowhere (`--dry-run`, the default: decisions are logged and taken as applied). SIGTERM or Ctrl-C
finishes the reconciles under way and exits 0.

`slopilot control --kube [--namespace NS]` runs in (or against) a cluster instead: the autoscalers are
the InferenceAutoscaler resources (and ScaledObjects, only with --scaled-objects or the annotation
slopilot.dev/managed: "true"), targets are scaled through their scale subresource, state and
conditions live in the resources' status, and two replicas elect a leader on a Lease.
"""

from __future__ import annotations

import argparse

HELP = "run autoscaler specs live against engines' metrics (Prometheus or a direct scrape)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from controlplane.settings import add_cli_args, add_kube_cli_args

    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--spec", action="append", metavar="FILE_OR_DIR",
                   help="ScaledObject / InferenceAutoscaler YAML (multi-document files, folders); repeatable")
    add_cli_args(p)  # where metrics come from, the state and decision log, workers, timeouts
    tgt = p.add_mutually_exclusive_group()
    tgt.add_argument("--scale-command", metavar="CMD",
                     help="run CMD to scale, with {name}, {target} and {replicas} substituted")
    tgt.add_argument("--dry-run", action="store_true",
                     help="apply nothing (the default without --scale-command)")
    p.add_argument("--initial-replicas", type=int, default=None,
                   help="replicas the target holds at start (default: the count saved in --state-dir, "
                        "else the spec's minimum)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve the controller's /metrics, /healthz and /readyz on this port (0: a free one)")
    p.add_argument("--metrics-address", default="0.0.0.0",
                   help="address those listen on (0.0.0.0: every one, so probes and Prometheus reach a pod; "
                        "127.0.0.1: this machine only)")
    p.add_argument("--down-after-polls", type=int, default=3, metavar="N",
                   help="/readyz answers 503 (with the reason) once a metric source failed N polls in a row")
    p.add_argument("--once", action="store_true",
                   help="one reconcile per autoscaler, then exit (status 1 when a metric source failed)")
    p.add_argument("--json-logs", action="store_true", help="log one JSON object per line")
    k = p.add_argument_group("Kubernetes (--kube)")
    k.add_argument("--kube", action="store_true",
                   help="watch InferenceAutoscaler resources and scale targets through the scale subresource "
                        "(in-cluster credentials, else KUBECONFIG / --kubeconfig)")
    k.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig to use instead of the in-cluster credentials")
    add_kube_cli_args(k)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading
    import time

    from controlplane import specs
    from controlplane.assemble import build_loop, source_for
    from controlplane.controller import Controller
    from controlplane.logs import setup_logging
    from controlplane.settings import from_cli
    from controlplane.state import StateStore
    from controlplane.targets import MemoryTarget
    from controlplane.targets.command import CommandTarget
    from controlplane.telemetry import Telemetry

    log = setup_logging(args.log_level, args.json_logs)
    settings = from_cli(args)
    if args.kube:
        return run_kube(args, settings, log)
    if not args.spec:
        raise ValueError("give --spec FILE_OR_DIR (the autoscalers to run), or --kube to watch a cluster's")
    loaded = specs.load(args.spec)
    for w in loaded.warnings:
        log.warning(w)
    model = settings.load_latency_model()
    saved = StateStore(settings.state_dir) if settings.state_dir else None

    def target_for(spec):
        start = spec.min_replicas if args.initial_replicas is None else args.initial_replicas
        record = saved.load(spec.name) if saved is not None and args.initial_replicas is None else None
        if record is not None and "replicas" in record:  # a restart: the count it left the target at
            start = int(record["replicas"])
        if args.scale_command:
            return CommandTarget(args.scale_command, spec.name, spec.target, start)
        return MemoryTarget(start, name=spec.name)

    telemetry = Telemetry()
    def source(spec, _target):
        return source_for(spec, settings, loaded)

    several = len(loaded.specs) > 1
    loops = [build_loop(spec, settings, target_for, source, model, where=str(path), several=several,
                        state=saved, telemetry=telemetry) for spec, path in loaded.specs]
    if args.down_after_polls < 1:
        raise ValueError(f"--down-after-polls must be >= 1, got {args.down_after_polls}")
    telemetry.down_after_polls = args.down_after_polls
    if args.once:
        failed = False
        for lp in loops:
            step = lp.tick(time.time())
            print(f"{lp.name}: desired {step.desired} ({step.decision.reason})"
                  + (f"; scale failed: {step.error}" if step.error else ""))
            for why in dict.fromkeys(lp.last_failures.values()):  # each message once
                print(f"{lp.name}: metric source {lp.health.where} failed: {why}", file=sys.stderr)
                failed = True
        return 1 if failed else 0
    if args.metrics_port is not None:
        port = telemetry.serve(args.metrics_port, args.metrics_address)
        log.info("controller metrics on http://%s:%d/metrics (/healthz, /readyz)", args.metrics_address, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    names = ", ".join(f"{lp.name} every {lp.interval:g}s" for lp in loops)
    print(f"controlling {len(loops)} autoscaler(s): {names}", file=sys.stderr, flush=True)
    Controller(loops, workers=settings.workers, telemetry=telemetry).run(stop)
    telemetry.stop()
    log.info("stopped")
    return 0


def run_kube(args: argparse.Namespace, settings, log) -> int:
    import dataclasses
    import signal
    import threading

    from controlplane.kube.client import connect, own_namespace
    from controlplane.kube.manager import KubeController
    from controlplane.telemetry import Telemetry

    given = {"--spec": args.spec, "--scrape": args.scrape, "--scale-command": args.scale_command,
             "--state-dir": args.state_dir, "--once": args.once, "--dry-run": args.dry_run}
    for flag, value in given.items():
        if value:
            raise ValueError(f"{flag} does not go with --kube: the cluster holds the autoscalers, their "
                             f"targets and their state")
    settings = dataclasses.replace(settings, lease_namespace=settings.lease_namespace or own_namespace())
    telemetry = Telemetry()
    ctl = KubeController(connect(args.kubeconfig), settings, latency_model=settings.load_latency_model(),
                         telemetry=telemetry)
    if args.metrics_port is not None:
        port = telemetry.serve(args.metrics_port, args.metrics_address)
        log.info("controller metrics on http://%s:%d/metrics (/healthz, /readyz)", args.metrics_address, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    where = f"namespace {args.namespace}" if args.namespace else "every namespace"
    log.info("watching InferenceAutoscalers in %s as %s", where, ctl.identity)
    ctl.run(stop)
    telemetry.stop()
    log.info("stopped")
    return 0
