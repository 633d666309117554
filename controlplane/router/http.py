"""The router's HTTP/1.1 server: httptools' parser (uvicorn's) on an asyncio protocol, one handler
task per request, answers written straight to the socket.

Why not uvicorn and ASGI: a routed stream is a relay, and through ASGI every upstream chunk wakes the
handler task, builds a message dict and goes through the server's send; here the upstream client's
callback writes each chunk to the client's socket itself (controlplane.router.upstream.Response.relay),
and a client that goes away closes the upstream request at once, with no task watching for it.

    server = HttpServer(handle, startup, shutdown, "127.0.0.1", 8080)
    server.run()               # until server.should_exit is set (another thread) or SIGINT/SIGTERM
    handle(request, conn)      # a coroutine: answers with conn.respond(...) or a stream:
                               # conn.start_stream(...), conn.send_chunk(...), conn.end_stream(...)
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

log = logging.getLogger("slopilot.router")

MAX_BODY_BYTES = 4 * 2**20
_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "too_large", "keep_alive", "http10")

    def __init__(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                 too_large: bool, keep_alive: bool, http10: bool = False):
        path, _, self.query = url.partition(b"?")
        self.method, self.path = method.decode("latin-1"), path.decode("latin-1")
        self.headers, self.body, self.too_large, self.keep_alive = headers, body, too_large, keep_alive
        self.http10 = http10  # an HTTP/1.0 client: a stream goes unframed, ended by closing


class Connection(asyncio.Protocol):
    """One client connection: requests in order (a pipelined one waits for the previous answer)."""

    def __init__(self, handle: Callable[[Request, Connection], Awaitable[None]], conns: set):
        self.handle, self.conns = handle, conns
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.busy = False
        self.pending: deque[Request] = deque()
        self.on_close: Callable[[], None] | None = None  # the relayed upstream answer's close
        self.on_resume: Callable[[], None] | None = None  # the relayed upstream's resume_reading
        self.write_paused = False
        self.answered = False  # the current request's answer is complete
        self.chunked = True  # its stream goes in chunks (not to an HTTP/1.0 client)
        self.started = False  # its answer has begun
        self.task: asyncio.Task | None = None  # the current request's handler
        self._url, self._headers, self._body, self._size = b"", [], [], 0

    # -- asyncio ---------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.conns.add(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.conns.discard(self)
        cb, self.on_close = self.on_close, None
        if cb is not None:
            cb()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        cb, self.on_resume = self.on_resume, None
        if cb is not None:
            cb()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b"upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed request: {exc}".encode())

    def _fail(self, status: int, why: bytes) -> None:
        if not self.busy:
            self.transport.write(_STATUS[status] + b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (len(why), why))
        self.transport.close()

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", [], [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if (b"expect", b"100-continue") in self._headers:  # curl waits for this before a large body
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= MAX_BODY_BYTES:
            self._body.append(body)

    def on_message_complete(self) -> None:
        p = self.parser
        req = Request(p.get_method(), self._url, self._headers, b"".join(self._body),
                      self._size > MAX_BODY_BYTES, p.should_keep_alive(), p.get_http_version() == "1.0")
        if self.busy:
            self.pending.append(req)
            self.transport.pause_reading()
        else:
            self._start(req)

    # -- one request at a time -------------------------------------------------------------------
    def _start(self, req: Request) -> None:
        self.busy, self.answered, self.started, self.keep_alive = True, False, False, req.keep_alive
        self.chunked = not req.http10
        self.task = asyncio.get_running_loop().create_task(self.handle(req, self))  # held: the loop's is weak
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self.busy, self.task = False, None
        self.on_close = self.on_resume = None
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("router error", exc_info=exc)
        if self.closed:
            return
        if not self.answered:  # the handler failed (or forgot): 500, or cut a started answer short
            if not self.started:
                self.respond(500, [(b"content-type", b"text/plain")], b"Internal Server Error")
            self.transport.close()
            return
        if not self.keep_alive:
            self.transport.close()
        elif self.pending:
            self._start(self.pending.popleft())
            if not self.pending:
                self.transport.resume_reading()

    # -- answers ---------------------------------------------------------------------------------
    def _head(self, status: int, headers: list[tuple[bytes, bytes]], framing: bytes) -> bytes:
        self.started = True
        lines = [_STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status]
        lines += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        lines.append(framing)
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                head_only: bool = False) -> None:
        """A whole answer (head_only: a HEAD request's, the length without the body)."""
        if self.closed or self.answered:
            return
        data = self._head(status, headers, b"content-length: %d\r\n" % len(body))
        self.transport.write(data if head_only else data + body)
        self.answered = True

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]], first: bytes = b"") -> None:
        """The head of a chunked answer (and its first chunk)."""
        if self.closed:
            return
        if not self.chunked:  # HTTP/1.0: the bytes as they come, the end is the connection's
            self.keep_alive = False
            self.transport.write(self._head(status, headers, b"") + first)
            return
        data = self._head(status, headers, b"transfer-encoding: chunked\r\n")
        self.transport.write(data + b"%x\r\n%s\r\n" % (len(first), first) if first else data)

    def send_chunk(self, data: bytes) -> None:
        if data and not self.closed:
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def end_stream(self, data: bytes = b"") -> None:
        """The last chunk (if any) and the end of the chunked answer."""
        if self.closed or self.answered:
            return
        if not self.chunked:
            self.transport.write(data)
        else:
            self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        self.answered = True


class HttpServer:
    """Serves `handle` on host:port; startup() runs before the socket opens, shutdown() after it closes."""

    def __init__(self, handle, startup: Callable[[], Awaitable[None]],
                 shutdown: Callable[[], Awaitable[None]], host: str, port: int):
        self.handle, self.startup, self.shutdown, self.host, self.port = handle, startup, shutdown, host, port
        self.started = False
        self.should_exit = False

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        conns: set[Connection] = set()
        await self.startup()
        server = await loop.create_server(lambda: Connection(self.handle, conns), self.host, self.port,
                                          reuse_address=True, backlog=2048)
        self.started = True
        try:
            while not self.should_exit:
                await asyncio.sleep(0.1)
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
