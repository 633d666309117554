"""The router's upstream HTTP/1.1 client: keep-alive connections per endpoint, answers parsed by
httptools (uvicorn's C parser), body chunks handed over as they arrive.

Why not aiohttp: per request it builds a request and a response object, header multidicts, a stream
reader, timers and a cookie jar: the largest share of the router's CPU per routed request (about 40%
of its Python time under a streaming load). A proxy that already holds the body bytes and relays
chunks needs a socket, a parser and a buffer.

    up = Upstream(connect_timeout=5.0)
    r = await up.request("http://127.0.0.1:8001", b"POST", "/v1/completions", headers, body)
    r.status, r.headers          # headers: [(name, value)] as bytes, as the endpoint sent them
    chunk = await r.read_chunk()  # b"" once the answer is complete; r.complete: nothing more to come
    r.close()                     # before the end: the connection is closed (the engine aborts)
    status, body = await up.get("http://127.0.0.1:8001", "/metrics", timeout=1.0)
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

HIGH_WATER = 1 << 20  # bytes buffered from an endpoint before its socket stops being read


class UpstreamError(Exception):
    """The endpoint could not be reached (refused: the connection itself failed) or its answer broke off."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class AnswerTooLarge(UpstreamError):
    """The answer is longer than the caller would hold."""


class UpstreamTimeout(UpstreamError):
    """No complete answer (or no first byte) within the request's timeout."""

    def __init__(self, message: str, nothing_received: bool = False):
        super().__init__(message)
        self.nothing_received = nothing_received


class Response:
    """One answer: status and headers once `request` returns, then body chunks as they arrive."""

    __slots__ = ("status", "headers", "keep_alive", "_conn", "_chunks", "_size", "_done", "_error",
                 "_waiter", "_any_byte", "_timer", "_sink", "tail", "_want_body", "_fb_timer")

    def __init__(self, conn: _Connection):
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self._conn: _Connection | None = conn
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._done = False  # the whole answer has arrived (it may still sit in _chunks)
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future | None = None
        self._any_byte = False
        self._timer: asyncio.TimerHandle | None = None  # the whole answer's deadline
        self._fb_timer: asyncio.TimerHandle | None = None  # the first byte's
        self._sink = None  # while relaying: where each read's body goes (an http.Connection)
        self.tail = b""  # the last bytes relayed
        self._want_body = False  # request() returns at the first body bytes, not at the headers

    @property
    def complete(self) -> bool:
        """Everything has been read: the next read_chunk returns b""."""
        return self._done and not self._chunks

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _head(self, body: bool) -> None:
        """Waits for the status line and headers, and with `body` for the first body bytes too (or the
        end); closes the connection when that fails."""
        try:
            while not self.status or body and not self._chunks and not self._done:
                if self._error is not None:
                    raise self._error
                await self._wait()
        except BaseException:
            self.close()
            raise

    async def read_chunk(self) -> bytes:
        """What has arrived since the last call (joined), waiting for something; b"" at the end.
        Raises UpstreamError when the connection broke before the end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()
        chunks = self._chunks
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        if self._size >= HIGH_WATER and self._conn is not None:
            self._conn.transport.resume_reading()
        self._size = 0
        return data

    async def relay(self, sink) -> UpstreamError | None:
        """Hands the rest of the answer to `sink` as it arrives: what each socket read brings goes out
        with sink.send_chunk from the connection's callback, the last with sink.end_stream. Returns
        when the answer is complete (None) or broke off (the error; the sink's stream is left open).
        While the sink's socket is backed up (sink.write_paused) the endpoint's is not read."""
        self._flush(sink)
        if not self._done and self._error is None:
            self._sink = sink
            if self._size >= HIGH_WATER and self._conn is not None:
                self._conn.transport.resume_reading()
            self._size = 0
            try:
                await self._wait()
            finally:
                self._sink = None
        if self._error is not None:
            return self._error
        self._flush(sink)
        return None

    def _flush(self, sink) -> None:
        chunks = self._chunks
        if chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self.tail = data
            if not self._done:
                sink.send_chunk(data)
                if sink.write_paused and self._conn is not None:
                    transport = self._conn.transport
                    transport.pause_reading()
                    sink.on_resume = transport.resume_reading
                return
            sink.end_stream(data)
        elif self._done:
            sink.end_stream()

    async def read_all(self, limit: int | None = None) -> bytes:
        """The rest of the answer; AnswerTooLarge (the connection closed) past `limit` bytes."""
        parts, size = [], 0
        while chunk := await self.read_chunk():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                self.close()
                raise AnswerTooLarge(f"the endpoint's answer is over {limit} bytes")
        return b"".join(parts)

    def close(self) -> None:
        """Done with it: an unfinished answer's connection is closed (the endpoint sees the client go)."""
        conn, self._conn = self._conn, None
        self._cancel_timers()
        if conn is not None and not self._done:
            conn.transport.close()

    def _cancel_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fb_timer is not None:
            self._fb_timer.cancel()
            self._fb_timer = None

    # -- fed by the connection -------------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if not self._done and self._error is None:
            self._error = error
            self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; the parser calls back on_* as the answer's bytes come in."""

    def __init__(self, pool: Upstream, key: tuple[str, int]):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.used = False  # has carried an answer before (a stale keep-alive may be closed by now)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool._discard(self)
        r, self.response = self.response, None
        if r is not None:
            framed = any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in r.headers)
            if r.status and not framed:
                r._done = True  # an answer delimited by the connection's end
                r._wake()
            else:
                r._fail(UpstreamError(f"connection lost ({type(exc).__name__ if exc else 'closed'})"))

    def data_received(self, data: bytes) -> None:
        r = self.response
        if r is None:  # nothing was asked: an idle connection the endpoint is closing, or garbage
            self.transport.close()
            return
        if not r._any_byte:
            r._any_byte = True
            if r._fb_timer is not None:
                r._fb_timer.cancel()
                r._fb_timer = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            r._fail(UpstreamError(f"malformed answer: {exc}"))
            self.transport.close()
        if r._sink is not None and r._error is None:
            r._flush(r._sink)  # relayed as it came: one write to the client per read here

    def eof_received(self):
        return False  # close our side too

    # -- parser callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        r = self.response
        r.status = self.parser.get_status_code()
        r.keep_alive = self.parser.should_keep_alive()
        if not r._want_body:
            r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        r._chunks.append(body)
        if r._sink is None:
            r._size += len(body)
            if r._size >= HIGH_WATER:
                self.transport.pause_reading()
            r._wake()

    def on_message_complete(self) -> None:
        r, self.response = self.response, None
        r._done = True
        r._conn = None
        r._cancel_timers()
        if r._size >= HIGH_WATER:
            self.transport.resume_reading()
        r._wake()
        if r.keep_alive:
            self.used = True
            self.pool._release(self)
        else:
            self.transport.close()


class Upstream:
    """Keep-alive connections to the endpoints (no limit on their number; idle ones are reused)."""

    def __init__(self, connect_timeout: float, max_idle: int = 256):
        self.connect_timeout, self.max_idle = connect_timeout, max_idle
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._keys: dict[str, tuple[str, int, bytes]] = {}  # base URL -> host, port, Host header

    def _key(self, url: str) -> tuple[str, int, bytes]:
        k = self._keys.get(url)
        if k is None:
            rest = url.split("://", 1)[-1].split("/", 1)[0]
            host, _, port = rest.rpartition(":") if rest.rfind(":") > rest.rfind("]") else (rest, "", "80")
            host = host.strip("[]")
            k = self._keys[url] = (host, int(port), rest.encode("latin-1"))
        return k

    async def _connect(self, key: tuple[str, int], timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        limit = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(self, key), *key),
                                             limit)
        except asyncio.TimeoutError:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]}: {exc}", refused=True) from None
        return conn

    def _release(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle and not conn.closed:
            idle.append(conn)
        else:
            conn.transport.close()

    def _discard(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def request(self, url: str, method: bytes, path: str, headers: bytes, body: bytes = b"",
                      timeout: float | None = None, first_body: bool = False,
                      first_byte_timeout: float | None = None) -> Response:
        """Sends the request and waits for the answer's status and headers (with `first_body`, for its
        first body bytes too: one wake-up instead of two). `headers`: the header lines
        (b"name: value\\r\\n" each) besides Host and Content-Length. With `timeout`, the connection
        is closed if the whole answer has not arrived by then; with `first_byte_timeout`, if no byte
        of it has (UpstreamTimeout either way; a first-byte one has `nothing_received` set)."""
        host, port, host_header = self._key(url)
        key = (host, port)
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            method, path.encode("latin-1"), host_header, len(body), headers)
        data = head + body
        idle = self._idle.get(key)
        conn = idle.pop() if idle else await self._connect(key, timeout)
        r = self._start(conn, data, timeout, first_body, first_byte_timeout)
        try:
            await r._head(first_body)
            return r
        except UpstreamError as exc:
            if not conn.used or r._any_byte or isinstance(exc, UpstreamTimeout):
                raise
        # a reused connection the endpoint closed while it sat idle, before any byte of the answer:
        # once more on a new one (the endpoint never saw the request)
        r = self._start(await self._connect(key, timeout), data, timeout, first_body, first_byte_timeout)
        await r._head(first_body)
        return r

    @staticmethod
    def _start(conn: _Connection, data: bytes, timeout: float | None, first_body: bool,
               first_byte_timeout: float | None = None) -> Response:
        r = conn.response = Response(conn)
        r._want_body = first_body
        if conn.closed:
            r._fail(UpstreamError("connection lost (closed while idle)"))
        else:
            conn.transport.write(data)
        if timeout is not None:
            r._timer = asyncio.get_running_loop().call_later(timeout, _time_out, r, conn, timeout)
        if first_byte_timeout is not None:
            r._fb_timer = asyncio.get_running_loop().call_later(first_byte_timeout, _no_first_byte, r, conn,
                                                                first_byte_timeout)
        return r

    async def get(self, url: str, path: str, timeout: float, headers: bytes = b"") -> tuple[int, bytes]:
        """A whole GET answer (status, body) within `timeout` seconds; UpstreamError otherwise."""
        r = await self.request(url, b"GET", path, headers, timeout=timeout)
        try:
            return r.status, await r.read_all()
        finally:
            r.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()


def _time_out(r: Response, conn: _Connection, timeout: float) -> None:
    if not r._done:
        r._fail(UpstreamTimeout(f"no complete answer within {timeout:g} s"))
        conn.transport.close()


def _no_first_byte(r: Response, conn: _Connection, timeout: float) -> None:
    if not r._any_byte and not r._done:
        r._fail(UpstreamTimeout(f"no answer within {timeout:g} s", nothing_received=True))
        conn.transport.close()
