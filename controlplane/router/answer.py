"""One answer from an engine, as the router's upstream client reads it (controlplane.router.upstream):
status and headers, then body chunks handed over as they arrive or relayed straight to the client's
socket, with backpressure past HIGH_WATER buffered bytes; the deadlines that fail it; its errors."""

from __future__ import annotations

import asyncio
from collections import deque

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

    def __init__(self, conn: asyncio.Protocol):
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self._conn: asyncio.Protocol | None = conn  # upstream._Connection
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


def time_out(r: Response, conn: asyncio.Protocol, timeout: float) -> None:
    if not r._done:
        r._fail(UpstreamTimeout(f"no complete answer within {timeout:g} s"))
        conn.transport.close()


def no_first_byte(r: Response, conn: asyncio.Protocol, timeout: float) -> None:
    if not r._any_byte and not r._done:
        r._fail(UpstreamTimeout(f"no answer within {timeout:g} s", nothing_received=True))
        conn.transport.close()
