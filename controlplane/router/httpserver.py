"""The router's HTTP server: listens, serves each connection with controlplane.router.http's
Connection, sweeps the connections' deadlines (timeouts without a timer per request), and closes
gracefully.

    server = HttpServer(handle, startup, shutdown, "127.0.0.1", 8080, limits=ServerLimits())
    server.run()               # until server.should_exit is set (another thread) or SIGINT/SIGTERM
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable

from controlplane.router.http import DEFAULT_LIMITS, Connection
from controlplane.router.limits import ServerLimits, connection_cap, raise_nofile


class HttpServer:
    """Serves `handle` on host:port; startup() runs before the socket opens, shutdown() after it closes."""

    def __init__(self, handle, startup: Callable[[], Awaitable[None]],
                 shutdown: Callable[[], Awaitable[None]], host: str, port: int,
                 limits: ServerLimits = DEFAULT_LIMITS):
        self.handle, self.startup, self.shutdown, self.host, self.port = handle, startup, shutdown, host, port
        self.limits = limits
        self.started = False
        self.should_exit = False
        self.conns: set[Connection] = set()
        self.cap = 0  # client connections at once (set at start, from the descriptor limit)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        conns = self.conns
        self.cap = cap = connection_cap(self.limits, raise_nofile())
        await self.startup()
        server = await loop.create_server(lambda: Connection(self.handle, conns, self.limits, cap), self.host,
                                          self.port, reuse_address=True, backlog=2048)
        self.started = True
        next_sweep = loop.time()
        try:
            while not self.should_exit:
                await asyncio.sleep(0.1)
                now = loop.time()
                if now >= next_sweep:  # timeouts by a sweep: nothing to arm or cancel per request
                    next_sweep = now + 0.5
                    for c in [c for c in conns if c.deadline < now]:
                        c.expire()
        finally:
            server.close()
            for c in list(conns):  # idle keep-alive connections close now; busy ones get a moment
                if not c.busy:
                    c.transport.close()
            for _ in range(50):
                if not conns:
                    break
                await asyncio.sleep(0.1)
            for c in list(conns):
                c.transport.abort()
            await self.shutdown()

    def run(self) -> None:
        """Serves in this thread on a new event loop (uvloop's when installed) until should_exit."""
        try:
            import uvloop
            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: setattr(self, "should_exit", True))
        try:
            loop.run_until_complete(self.serve())
        finally:
            loop.close()
