"""The router's HTTP/1.1 server: httptools' parser (uvicorn's) on an asyncio protocol, one handler
task per request, answers written straight to the socket.

Why not uvicorn and ASGI: a routed stream is a relay, and through ASGI every upstream chunk wakes the
handler task, builds a message dict and goes through the server's send; here the upstream client's
callback writes each chunk to the client's socket itself (controlplane.router.answer.Response.relay),
and a client that goes away closes the upstream request at once, with no task watching for it.

    server = HttpServer(handle, startup, shutdown, "127.0.0.1", 8080)   # controlplane.router.httpserver
    server.run()               # until server.should_exit is set (another thread) or SIGINT/SIGTERM
    handle(request, conn)      # a coroutine: answers with conn.respond(...) or a stream:
                               # conn.start_stream(...), conn.send_chunk(...), conn.end_stream(...)
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

from controlplane.router.limits import ServerLimits

log = logging.getLogger("slopilot.router")
DEFAULT_LIMITS = ServerLimits()

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
    """One client connection: requests in order (a pipelined one waits for the previous answer).

    Limits (controlplane.router.limits): `deadline` is the loop time by which the head, the body or
    the next request of an idle keep-alive connection must have arrived (HttpServer's sweep closes
    it after), and the head's size is checked as it arrives. Past `cap` connections, a new one is
    answered 503 and closed."""

    def __init__(self, handle: Callable[[Request, Connection], Awaitable[None]], conns: set,
                 limits: ServerLimits = DEFAULT_LIMITS, cap: int | None = None):
        self.handle, self.conns, self.limits, self.cap = handle, conns, limits, cap
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
        self.deadline = math.inf  # loop time; see the class's docstring
        self.begun = False  # bytes of a request not yet complete have arrived
        self._in_head = True  # the next bytes are a request head's
        self._head_bytes = 0  # bytes read while the head was unfinished (the parser buffers them)
        self._header_bytes = 0  # the header fields' names and values
        self._too_big = 0  # 414 or 431 once the head is over a limit
        self._fail_after: tuple[int, bytes] | None = None  # an error found while an answer runs
        self._close_after = False  # an upgrade or CONNECT: answer it, then close

    # -- asyncio ---------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.cap is not None and len(self.conns) >= self.cap:
            why = b"too many open connections to the router"
            self.closed = True
            transport.write(_STATUS[503] + b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                            % (len(why), why))
            transport.close()
            return
        self.conns.add(self)
        self.deadline = asyncio.get_running_loop().time() + self.limits.header_timeout

    def expire(self) -> None:
        """Past the deadline: 408 for a request that had begun, the connection closed either way."""
        if self.busy or self.closed:
            return
        if self.begun:
            self._fail(408, b"the request did not arrive in time")
        else:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.conns.discard(self)
        cb, self.on_close = self.on_close, None
        if cb is not None:
            cb()  # a relayed answer: its upstream request is closed (the engine aborts)
        elif self.task is not None and not self.task.done():
            self.task.cancel()  # gone before its answer began: the handler stops, its upstream closes

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        cb, self.on_resume = self.on_resume, None
        if cb is not None:
            cb()

    def data_received(self, data: bytes) -> None:
        if self._fail_after is not None or self._close_after:
            return  # nothing more is read from this connection
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # an Upgrade or CONNECT request, complete: answered, then closed
            self._close_after = True
            if self.busy and not self.started:
                self.keep_alive = False  # its answer says so
            if not self.busy and not self.pending:
                self._fail(400, b"upgrades and CONNECT are not supported")
            return
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed request: {exc}".encode())
            return
        if self._in_head and self.begun:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes + self.limits.max_url_bytes:
                self._too_big = self._too_big or (414 if not self._headers else 431)
        if self._too_big:
            self._fail(self._too_big, b"the request line is too long" if self._too_big == 414
                       else b"the request header fields are too large")

    def _fail(self, status: int, why: bytes) -> None:
        """An error answer, then the connection closes; while an answer is being sent, after it."""
        if self.busy or self.pending:
            if self._fail_after is None:
                self._fail_after = (status, why)
                self.transport.pause_reading()
            return
        if not self.closed:
            self.transport.write(_STATUS[status] + b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (len(why), why))
        self.closed = True
        self.transport.close()

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", [], [], 0
        self._in_head, self._head_bytes, self._header_bytes, self.begun = True, 0, 0, True
        if not self.busy:
            self.deadline = asyncio.get_running_loop().time() + self.limits.header_timeout

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.limits.max_url_bytes:
            self._too_big = 414
            self._url = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a chunked body's trailer fields: not headers of the request
            return
        self._header_bytes += len(name) + len(value)
        self._headers.append((name.lower(), value))
        if len(self._headers) > self.limits.max_headers or self._header_bytes > self.limits.max_head_bytes:
            self._too_big = self._too_big or 431

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._too_big:
            return
        if not self.busy:
            self.deadline = asyncio.get_running_loop().time() + self.limits.body_timeout
        if (b"expect", b"100-continue") in self._headers:  # curl waits for this before a large body
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= MAX_BODY_BYTES:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes, self.begun = True, 0, False
        if self._too_big:
            return
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
        self.deadline = math.inf  # the upstream's timeouts bound an answer
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
            if not self.pending and self._fail_after is None:
                self.transport.resume_reading()
        elif self._fail_after is not None:  # a malformed request after the ones answered
            self._fail(*self._fail_after)
        elif self._close_after:
            self.transport.close()
        else:
            self.deadline = asyncio.get_running_loop().time() + (
                self.limits.header_timeout if self.begun else self.limits.idle_timeout)

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

    def start_sized(self, status: int, headers: list[tuple[bytes, bytes]], length: int,
                    first: bytes = b"") -> None:
        """The head of an answer of `length` bytes relayed as they come (send_chunk, end_stream)."""
        if self.closed:
            return
        self.chunked = False
        self.transport.write(self._head(status, headers, b"content-length: %d\r\n" % length) + first)

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
