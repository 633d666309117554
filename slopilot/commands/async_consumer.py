"""`slopilot async`: the async processor, requests from a Redis stream through the router's batch band.

    slopilot async --redis redis://127.0.0.1:6379/0 --stream requests --router http://127.0.0.1:8080
    redis-cli XADD requests '*' id r1 body '{"model": "tiny", "prompt": "hi"}' reply_to results

Each result goes to the stream (`reply_to`) or key (`reply_key`) the request names, as a batch output
line, written in one transaction with the request's acknowledgement. See
controlplane/batch/queue_consumer.py for the fields and the delivery guarantee.
"""

from __future__ import annotations

import argparse
import socket

HELP = "consume requests from a Redis stream and send them through the router's batch band"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="the Redis URL")
    p.add_argument("--stream", required=True, help="the stream requests are added to")
    p.add_argument("--router", required=True, metavar="URL", help="the router's base URL (slopilot route)")
    p.add_argument("--group", default="slopilot", help="the consumer group (created if missing)")
    p.add_argument("--consumer", default=None,
                   help="this process's consumer name (default: the host name); a restart with the same name "
                        "resumes its pending entries")
    p.add_argument("--priority", default="0",
                   help="the router's band for these requests, a name or a priority (its batch band; 0 is "
                        "the one band of a router without flow control)")
    p.add_argument("--engine-priority", type=int, default=None, metavar="P",
                   help="the `priority` field sent with each request that has none (the engines' "
                        "--background-priority; default: none sent)")
    p.add_argument("--max-inflight", type=int, default=32, help="requests out at a time")
    p.add_argument("--claim-idle", type=float, default=60.0, metavar="SECONDS",
                   help="claim another consumer's pending entries once idle this long")
    p.add_argument("--api-key", default=None, help="the router's API key")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from controlplane.batch.queue_consumer import QueueConsumer

    if args.max_inflight < 1 or args.claim_idle <= 0:
        raise ValueError("--max-inflight must be >= 1 and --claim-idle > 0")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        consumer = QueueConsumer(args.redis, args.stream, args.router, args.group,
                                 args.consumer or socket.gethostname(), args.priority, args.max_inflight,
                                 args.claim_idle, api_key=args.api_key,
                                 engine_priority=args.engine_priority)
        await consumer.run(stop)

    asyncio.run(main())
    return 0
