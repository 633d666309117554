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
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--spec", action="append", metavar="FILE_OR_DIR",
                   help="ScaledObject / InferenceAutoscaler YAML (multi-document files, folders); repeatable")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL", help="Prometheus server for every trigger and aggregate")
    src.add_argument("--scrape", action="append", metavar="URL",
                     help="scrape these engine /metrics endpoints directly instead of asking Prometheus")
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang", "slopilot"],
                   help="metric names the engines export")
    p.add_argument("--latency-model", metavar="NAME_OR_JSON", help="step-time model for sloModel policies")
    tgt = p.add_mutually_exclusive_group()
    tgt.add_argument("--scale-command", metavar="CMD",
                     help="run CMD to scale, with {name}, {target} and {replicas} substituted")
    tgt.add_argument("--dry-run", action="store_true",
                     help="apply nothing (the default without --scale-command)")
    p.add_argument("--initial-replicas", type=int, default=None,
                   help="replicas the target holds at start (default: the count saved in --state-dir, "
                        "else the spec's minimum)")
    p.add_argument("--state-dir", help="save each policy's state here after every decision, resume from it")
    p.add_argument("--decision-log", metavar="FILE",
                   help="append a replayable CSV row per reconcile ({name} in the path for several specs)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve the controller's /metrics, /healthz and /readyz on this port (0: a free one)")
    p.add_argument("--workers", type=int, default=5, help="reconciles that may run at once")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds for each metric query")
    p.add_argument("--once", action="store_true", help="one reconcile per autoscaler, then exit")
    p.add_argument("--json-logs", action="store_true", help="log one JSON object per line")
    k = p.add_argument_group("Kubernetes (--kube)")
    k.add_argument("--kube", action="store_true",
                   help="watch InferenceAutoscaler resources and scale targets through the scale subresource "
                        "(in-cluster credentials, else KUBECONFIG / --kubeconfig)")
    k.add_argument("--namespace", metavar="NS", help="only this namespace's autoscalers (none: every one)")
    k.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig to use instead of the in-cluster credentials")
    k.add_argument("--scaled-objects", action="store_true",
                   help="also run every KEDA ScaledObject (only without KEDA; one ScaledObject opts in with "
                        "the annotation slopilot.dev/managed: \"true\")")
    k.add_argument("--lease-namespace", metavar="NS",
                   help="namespace of the leader-election Lease (none: the pod's own namespace)")
    k.add_argument("--lease-name", default="slopilot-controller", help="name of the leader-election Lease")
    k.add_argument("--no-leader-election", action="store_true", help="act without holding the Lease")
    k.add_argument("--lease-duration", type=float, default=15.0, help=argparse.SUPPRESS)
    k.add_argument("--renew-deadline", type=float, default=10.0, help=argparse.SUPPRESS)
    k.add_argument("--retry-period", type=float, default=2.0, help=argparse.SUPPRESS)
    k.add_argument("--scrape-interval", type=float, default=15.0,
                   help="seconds between scrapes of the target's pods (when no Prometheus is used)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading
    import time

    from controlplane import specs
    from controlplane.assemble import build_loops, source_for
    from controlplane.controller import Controller
    from controlplane.logs import setup_logging
    from controlplane.state import StateStore
    from controlplane.targets import MemoryTarget
    from controlplane.targets.command import CommandTarget
    from controlplane.telemetry import Telemetry

    log = setup_logging(args.log_level, args.json_logs)
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.kube:
        return run_kube(args, log)
    if not args.spec:
        raise ValueError("give --spec FILE_OR_DIR (the autoscalers to run), or --kube to watch a cluster's")
    loaded = specs.load(args.spec)
    for w in loaded.warnings:
        log.warning(w)
    model = None
    if args.latency_model:
        from simulator.latency import load_latency_model

        model = load_latency_model(args.latency_model)

    saved = StateStore(args.state_dir) if args.state_dir else None

    def target_for(spec):
        start = spec.min_replicas if args.initial_replicas is None else args.initial_replicas
        record = saved.load(spec.name) if saved is not None and args.initial_replicas is None else None
        if record is not None and "replicas" in record:  # a restart: the count it left the target at
            start = int(record["replicas"])
        if args.scale_command:
            return CommandTarget(args.scale_command, spec.name, spec.target, start)
        return MemoryTarget(start, name=spec.name)

    telemetry = Telemetry()
    def source(spec):
        return source_for(spec, loaded, args.prometheus, args.scrape, args.engine, args.timeout)

    loops = build_loops(loaded, target_for, source, model, args.state_dir, args.decision_log, telemetry)
    if args.once:
        for lp in loops:
            step = lp.tick(time.time())
            print(f"{lp.name}: desired {step.desired} ({step.decision.reason})"
                  + (f"; scale failed: {step.error}" if step.error else ""))
        return 0
    if args.metrics_port is not None:
        port = telemetry.serve(args.metrics_port)
        log.info("controller metrics on http://0.0.0.0:%d/metrics (/healthz, /readyz)", port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    names = ", ".join(f"{lp.name} every {lp.interval:g}s" for lp in loops)
    print(f"controlling {len(loops)} autoscaler(s): {names}", file=sys.stderr, flush=True)
    Controller(loops, workers=args.workers, telemetry=telemetry).run(stop)
    telemetry.stop()
    log.info("stopped")
    return 0


def run_kube(args: argparse.Namespace, log) -> int:
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
    model = None
    if args.latency_model:
        from simulator.latency import load_latency_model

        model = load_latency_model(args.latency_model)
    telemetry = Telemetry()
    ctl = KubeController(connect(args.kubeconfig), namespace=args.namespace,
                         scaled_objects=args.scaled_objects,
                         prometheus=args.prometheus, engine=args.engine, timeout=args.timeout,
                         latency_model=model,
                         telemetry=telemetry, workers=args.workers,
                         leader_election=not args.no_leader_election,
                         lease_namespace=args.lease_namespace or own_namespace(), lease_name=args.lease_name,
                         lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                         retry_period=args.retry_period, scrape_interval=args.scrape_interval,
                         decision_log=args.decision_log)
    if args.metrics_port is not None:
        port = telemetry.serve(args.metrics_port)
        log.info("controller metrics on http://0.0.0.0:%d/metrics (/healthz, /readyz)", port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    where = f"namespace {args.namespace}" if args.namespace else "every namespace"
    log.info("watching InferenceAutoscalers in %s as %s", where, ctl.identity)
    ctl.run(stop)
    telemetry.stop()
    log.info("stopped")
    return 0
