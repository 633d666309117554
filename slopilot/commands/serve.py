"""`slopilot serve`: the OpenAI-compatible engine server, real (weights) or emulated (latency model).

With --emulate, this command loads the latency model (simulator.latency) and hands it to the
engine's emulated runner: the engine itself never imports the simulator.
"""

from __future__ import annotations

import argparse

HELP = "serve the engine over an OpenAI-compatible HTTP API with vLLM-named /metrics"


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, unless its help already words it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "default" in (action.help or "") or action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.args import add_cli_args
    from engine.server import defaults

    p.formatter_class = _HelpWithDefaults
    p.add_argument("--version", action="version", version=f"slopilot {defaults.version()}")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                      help="preset name or a local model directory (same as --model)")
    what.add_argument("--model", default=None, help="preset name or a local model directory")
    what.add_argument("--emulate", metavar="MODEL", default=None,
                      help="no weights: step times from this latency model (a .json path or a shipped name)")
    p.add_argument("--served-model-name", default=None,
                   help="model name in the API and metrics (default: the model's)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; in a pod or container use 0.0.0.0, so that probes, the "
                        "Service and Prometheus can reach the server")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: no key)")
    p.add_argument("--protect-metrics", action="store_true",
                   help="require the API key on /metrics too (default: /metrics is open for scrapes, "
                        "as in vLLM)")
    p.add_argument("--max-waiting", type=int, default=defaults.MAX_WAITING,
                   help="answer 429 at once when this many requests are already waiting (0: refuse any "
                        "that would wait)")
    p.add_argument("--max-request-bytes", type=int, default=defaults.MAX_REQUEST_BYTES,
                   help="answer 413 to a larger request body, unread")
    p.add_argument("--body-timeout", type=float, default=defaults.BODY_TIMEOUT_S,
                   help="answer 408 to a request whose body has not arrived within this many seconds "
                        "(bodies being uploaded do not count toward the in-flight cap)")
    p.add_argument("--drain-timeout", type=float, default=defaults.DRAIN_TIMEOUT_S,
                   help="seconds to finish in-flight requests after SIGTERM; what still runs then gets a "
                        f"503 and the process exits {defaults.EXIT_DRAIN_INCOMPLETE}")
    p.add_argument("--health-hold", type=float, default=0.0, metavar="SECONDS",
                   help="answer /health with 503 for this long after start, to mimic model loading")
    p.add_argument("--startup-delay", dest="health_hold", type=float, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old name of --health-hold
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log level (a client that disconnects is logged at info)")
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help='a prefill/decode role, as vLLM takes it: {"kv_connector": "TcpConnector", '
                        '"kv_role": "kv_producer"|"kv_consumer"|"kv_both"} (optional kv_ip, kv_port, '
                        'kv_connector_extra_config.lease_timeout_s, link, send_bandwidth_gbs)')
    p.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help='publish KV cache events as vLLM does: {"enable_kv_cache_events": true, "publisher": '
                        '"zmq", "endpoint": "tcp://*:5557"} (optional replay_endpoint, topic, buffer_steps, '
                        'hwm, max_queue_size)')
    add_cli_args(p, real_only="real mode only")


def emulated_kv(engine_args, latency):
    """A derived model's KV cache (what its GPUs' memory leaves) unless --num-kv-blocks is given."""
    import dataclasses

    derived = latency.provenance.get("derived")
    if not derived or engine_args.num_kv_blocks is not None:
        return engine_args
    blocks = derived["memory"]["kv_tokens"] // engine_args.block_size
    return dataclasses.replace(engine_args, num_kv_blocks=max(int(blocks), 1))


def run(args: argparse.Namespace) -> int:
    import logging

    from engine.args import from_cli
    from engine.server import build_engine, build_server, serve

    if args.max_waiting < 0:
        raise ValueError("--max-waiting must be >= 0")
    if not args.body_timeout > 0:
        raise ValueError("--body-timeout must be > 0")
    if args.max_request_bytes < 1:
        raise ValueError("--max-request-bytes must be >= 1")
    if args.drain_timeout < 0 or args.health_hold < 0:
        raise ValueError("--drain-timeout and --health-hold must be >= 0")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine_args = from_cli(args, model=args.model or args.model_tag)
    kv_transfer = None
    if args.kv_transfer_config is not None:
        from engine.kv_transfer import parse_kv_transfer_config

        kv_transfer = parse_kv_transfer_config(args.kv_transfer_config)
    kv_events = None
    if args.kv_events_config is not None:
        from engine.kv_events import parse_kv_events_config

        kv_events = parse_kv_events_config(args.kv_events_config)
    latency = None
    if args.emulate:
        from simulator.latency import load_latency_model
        from simulator.pd_spec import model_kv_bytes_per_token

        latency = load_latency_model(args.emulate)
        engine_args = emulated_kv(engine_args, latency)
        kv_bytes = model_kv_bytes_per_token(latency)
        if kv_transfer is not None and kv_transfer.kv_bytes_per_token is None:
            kv_transfer.kv_bytes_per_token = kv_bytes
    engine, name = build_engine(engine_args, latency, kv_bytes_per_token=kv_bytes if args.emulate else None)
    if kv_events is not None and kv_events.enabled:
        from engine.kv_events import KVEvents

        KVEvents(engine, kv_events)
    app = build_server(engine, args.served_model_name or name, api_key=args.api_key,
                       protect_metrics=args.protect_metrics, max_waiting=args.max_waiting,
                       max_request_bytes=args.max_request_bytes, health_hold=args.health_hold,
                       kv_transfer=kv_transfer, body_timeout=args.body_timeout)
    print(f"serving {args.served_model_name or name} on http://{args.host}:{args.port}"
          f"{' (emulated)' if args.emulate else ''}", flush=True)
    return serve(app, args.host, args.port, args.drain_timeout, args.log_level)
