"""The router's upstream HTTP/1.1 client: keep-alive connections per endpoint, answers parsed by
httptools (uvicorn's C parser), body chunks handed over as they arrive (controlplane.router.answer).

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

import httptools

from controlplane.router.answer import (
    HIGH_WATER,
    Response,
    UpstreamError,
    UpstreamTimeout,
    no_first_byte,
    time_out,
)


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
            r._timer = asyncio.get_running_loop().call_later(timeout, time_out, r, conn, timeout)
        if first_byte_timeout is not None:
            r._fb_timer = asyncio.get_running_loop().call_later(first_byte_timeout, no_first_byte, r, conn,
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
