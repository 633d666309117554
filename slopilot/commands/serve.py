"""`slopilot serve`: the OpenAI-compatible engine server, real (weights) or emulated (latency model)."""

from __future__ import annotations

import argparse

HELP = "serve the engine over an OpenAI-compatible HTTP API with vLLM-named /metrics"


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="preset name or a local model directory")
    what.add_argument("--emulate", metavar="MODEL.json",
                      help="no weights: step times from this latency model (a path or a shipped name)")
    p.add_argument("--served-model-name", default=None, help="model name in the API and metrics")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="answer 429 when this many requests are already waiting (default: no limit)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to finish in-flight requests after SIGTERM")
    p.add_argument("--startup-delay", type=float, default=0.0,
                   help="hold /health at 503 for this long, to mimic model loading")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="real mode only")
    p.add_argument("--dtype", default="float32", help="real mode only")
    p.add_argument("--attention-backend", default="auto", help="real mode only")
    p.add_argument("--log-level", default="warning")


def run(args: argparse.Namespace) -> int:
    from engine.server import build_engine, build_server, serve

    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_waiting is not None and args.max_waiting < 0:
        raise ValueError("--max-waiting must be >= 0")
    if args.drain_timeout < 0 or args.startup_delay < 0:
        raise ValueError("--drain-timeout and --startup-delay must be >= 0")
    real = {} if args.emulate else dict(seed=args.seed, device=args.device, dtype=args.dtype,
                                        attention_backend=args.attention_backend)
    engine, name = build_engine(args.model, args.emulate, max_num_seqs=args.max_num_seqs,
                                max_num_batched_tokens=args.max_num_batched_tokens,
                                num_kv_blocks=args.num_kv_blocks, block_size=args.block_size,
                                max_model_len=args.max_model_len,
                                enable_prefix_caching=not args.no_prefix_caching, **real)
    app = build_server(engine, args.served_model_name or name, api_key=args.api_key,
                       max_waiting=args.max_waiting, startup_delay=args.startup_delay)
    print(f"serving {args.served_model_name or name} on http://{args.host}:{args.port}"
          f"{' (emulated)' if args.emulate else ''}", flush=True)
    return serve(app, args.host, args.port, args.drain_timeout, args.log_level)
