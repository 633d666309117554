"""`slopilot serve`: the OpenAI-compatible engine server, real (weights) or emulated (latency model).

With --emulate, this command loads the latency model (simulator.latency) and hands it to the
engine's emulated runner: the engine itself never imports the simulator.
"""

from __future__ import annotations

import argparse

HELP = "serve the engine over an OpenAI-compatible HTTP API with vLLM-named /metrics"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.args import add_cli_args

    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="preset name or a local model directory")
    what.add_argument("--emulate", metavar="MODEL",
                      help="no weights: step times from this latency model (a .json path or a shipped name)")
    p.add_argument("--served-model-name", default=None, help="model name in the API and metrics")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="answer 429 when this many requests are already waiting (default: no limit)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to finish in-flight requests after SIGTERM")
    p.add_argument("--health-hold", type=float, default=0.0, metavar="SECONDS",
                   help="answer /health with 503 for this long after start, to mimic model loading")
    p.add_argument("--startup-delay", dest="health_hold", type=float, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old name of --health-hold
    p.add_argument("--log-level", default="warning")
    add_cli_args(p, real_only="real mode only")


def run(args: argparse.Namespace) -> int:
    from engine.args import from_cli
    from engine.server import build_engine, build_server, serve

    if args.max_waiting is not None and args.max_waiting < 0:
        raise ValueError("--max-waiting must be >= 0")
    if args.drain_timeout < 0 or args.health_hold < 0:
        raise ValueError("--drain-timeout and --health-hold must be >= 0")
    engine_args = from_cli(args, model=args.model)
    latency = None
    if args.emulate:
        from simulator.latency import load_latency_model

        latency = load_latency_model(args.emulate)
    engine, name = build_engine(engine_args, latency)
    app = build_server(engine, args.served_model_name or name, api_key=args.api_key,
                       max_waiting=args.max_waiting, health_hold=args.health_hold)
    print(f"serving {args.served_model_name or name} on http://{args.host}:{args.port}"
          f"{' (emulated)' if args.emulate else ''}", flush=True)
    return serve(app, args.host, args.port, args.drain_timeout, args.log_level)
