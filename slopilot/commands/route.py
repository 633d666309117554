"""`slopilot route`: the LLM-aware router in front of engine endpoints.

    slopilot route --endpoint http://127.0.0.1:8001 --endpoint http://127.0.0.1:8002 -c examples/router.yaml
    slopilot route --targets out/fleet/fleet/prometheus_targets.json     # a running `fleet up`'s replicas
    slopilot route --k8s-service llama --namespace serving --k8s-port http

OpenAI /v1/completions and /v1/chat/completions (streams passed through), /v1/models, /health,
/metrics (llm-d's router metric names), and OpenAI's Batch API (/v1/files, /v1/batches) kept in SQLite
under --state-dir, its lines sent through the lowest-priority band of the gateway queue.
See routing/config.py for ROUTER.yaml.
"""

from __future__ import annotations

import argparse

HELP = "run the LLM-aware router (OpenAI proxy, filter-score-pick, gateway queue) in front of engines"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="an engine's base URL (repeat for more)")
    p.add_argument("--targets", metavar="FILE_SD.json",
                   help="follow a Prometheus file_sd target file (e.g. what `fleet up` writes)")
    p.add_argument("--k8s-service", metavar="NAME", help="follow a Kubernetes Service's EndpointSlices")
    p.add_argument("--namespace", default="default", help="the Service's namespace")
    p.add_argument("--k8s-port", default=None, help="the port name or number on the EndpointSlices")
    p.add_argument("--config", "-c", metavar="ROUTER.yaml",
                   help="an EndpointPickerConfig (default: queue, kv, prefix scorers; no flow control)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: pass the "
                                                   "client's header on to the engines)")
    p.add_argument("--upstream-api-key", default=None, help="the key to send to the engines instead")
    p.add_argument("--pool-name", default="default", help="the inference_pool label of the metrics")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="keep the Batch API's files, batches and per-line progress here (SQLite); a "
                        "restarted router resumes every batch. Default: in memory, lost at exit")
    p.add_argument("--batch-max-inflight", type=int, default=64, metavar="N",
                   help="batch lines out at a time (held in the gateway's batch band or at an engine)")
    p.add_argument("--batch-engine-priority", type=int, default=None, metavar="P",
                   help="send batch lines with this `priority` field (unless a line sets one): with engines "
                        "run with --scheduling-policy priority --background-priority P they yield every "
                        "step interactive requests need. Default: none sent (vLLM rejects a priority "
                        "under its default fcfs policy)")
    p.add_argument("--max-connections", type=int, default=10_000,
                   help="client connections at once (also kept under half the descriptor limit); "
                        "past it a new connection gets 503")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds for a request's line and headers to arrive (else 408)")
    p.add_argument("--body-timeout", type=float, default=60.0, help="seconds for a request's body (else 408)")
    p.add_argument("--idle-timeout", type=float, default=60.0,
                   help="seconds a keep-alive connection may idle")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--prefill-endpoint", action="append", default=[], metavar="URL",
                   help="a prefill engine (kv_producer role; repeatable): turns on the P/D profile, the "
                        "endpoints above then decode (kv_consumer role)")
    p.add_argument("--pd-threshold", type=int, default=0, metavar="TOKENS",
                   help="with --prefill-endpoint: disaggregate a request when its prompt has more than "
                        "this many uncached tokens, else send it whole to a decode endpoint")
    p.add_argument("--pd-shared-kv", action="store_true",
                   help="with --prefill-endpoint: the engines share KV through storage keyed by the prompt "
                        "(vLLM's ExampleConnector, LMCache), so the prefill answer carries no "
                        "kv_transfer_params and the decode hop is sent the original request")


def run(args: argparse.Namespace) -> int:
    import logging

    from controlplane.router import discovery
    from controlplane.router.app import build_router_app
    from controlplane.router.httpserver import HttpServer
    from controlplane.router.limits import ServerLimits
    from routing.config import load_router_config

    sources = [bool(args.endpoint), bool(args.targets), bool(args.k8s_service)]
    if sum(sources) != 1:
        raise ValueError("give exactly one of --endpoint (repeatable), --targets or --k8s-service")
    cfg = load_router_config(args.config)
    if args.endpoint:
        discover = discovery.static(args.endpoint)
    elif args.targets:
        discover = discovery.file_sd(args.targets)
    else:
        discover = discovery.KubernetesEndpoints(args.k8s_service, args.namespace, args.k8s_port)
    pd = None
    if args.prefill_endpoint:
        from controlplane.router.pd import PDSettings

        pd = PDSettings(args.prefill_endpoint, args.pd_threshold, shared_kv=args.pd_shared_kv)
    if args.batch_max_inflight < 1:
        raise ValueError(f"--batch-max-inflight must be >= 1, got {args.batch_max_inflight}")
    app = build_router_app(cfg, discover, api_key=args.api_key, upstream_key=args.upstream_api_key,
                           pool_name=args.pool_name, state_dir=args.state_dir,
                           batch_inflight=args.batch_max_inflight, pd=pd,
                           batch_engine_priority=args.batch_engine_priority)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    for flag in ("max_connections", "header_timeout", "body_timeout", "idle_timeout"):
        if not getattr(args, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0")
    limits = ServerLimits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                          idle_timeout=args.idle_timeout, max_connections=args.max_connections)
    HttpServer(app.handle, app.startup, app.shutdown, args.host, args.port, limits).run()
    return 0
