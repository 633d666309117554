"""What every request passes before routing (pure ASGI, so streaming is untouched): the API key
(401), the loading / dead-engine check (503), the body-size limit (413) and the cap on requests in
flight (429). The cap refuses a request before its body is read, so a flood of clients costs a few
objects each: the memory held and the garbage collector's pauses stay bounded. A request counts
toward that cap only once its body has arrived: bodies still being uploaded have their own, larger
cap and a deadline (408), so slow uploads never take the places of requests being served.

GET /health is answered here too, from the same readiness check: no routing, no response object,
so a liveness probe costs the event loop a few microseconds however busy the app is."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable

from engine.server.protocol import APIError


async def send_empty(send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def send_error(send, error: APIError, close: bool = False) -> None:
    """The error at once, the body unread. The connection stays open (unless `close`): uvicorn then
    reads and drops the rest of the body, so a client still sending it reads this answer instead of
    a reset."""
    # ASCII JSON: an error body can never fail to encode, whatever text it quotes
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (--max-request-bytes)",
                    "RequestTooLargeError")


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class Gate:
    """ready() -> None when requests may run, else the 503 message (still loading, engine dead).
    max_in_flight: POSTs to /v1 at once whose body has arrived (queued, running or answered); None: no
    cap. Bodies being read: at most READING_FACTOR times that, each within body_timeout seconds."""

    READING_FACTOR = 4

    def __init__(self, app, *, api_key: str | None, protect_metrics: bool, max_body_bytes: int,
                 max_in_flight: int | None, ready: Callable[[], str | None], body_timeout: float = 30.0):
        self.app, self.max_body_bytes, self.ready = app, max_body_bytes, ready
        self.key = f"Bearer {api_key}".encode() if api_key is not None else None
        self.protect_metrics = protect_metrics
        self.max_in_flight, self.in_flight = max_in_flight, 0
        self.max_reading = None if max_in_flight is None else self.READING_FACTOR * max_in_flight
        self.reading, self.body_timeout = 0, body_timeout

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.key)  # constant time: no key prefix leaks by timing

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/health" and scope["method"] in ("GET", "HEAD"):
            await send_empty(send, 200 if self.ready() is None else 503)
            return
        api = path.startswith("/v1")
        if self.key is not None and (api or (self.protect_metrics and path == "/metrics")) \
                and not self._authorized(scope):
            await send_error(send, APIError(401, "missing or invalid API key", "AuthenticationError"))
            return
        if api and (not_ready := self.ready()) is not None:
            await send_error(send, APIError(503, not_ready, "ServiceUnavailableError"))
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await send_error(send, _too_large(self.max_body_bytes))
            return
        counted = api and scope["method"] == "POST"
        if counted and self._full():
            await send_error(send, self._overloaded())
            return
        if counted and self.max_reading is not None and self.reading >= self.max_reading:
            await send_error(send, APIError(429, f"the server is overloaded: {self.reading} request bodies "
                                                 "are being uploaded", "RateLimitError"))
            return
        self.reading += counted
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._read_body(receive)
        except TimeoutError:
            why = f"the request body did not arrive within {self.body_timeout:g} s"
            await send_error(send, APIError(408, why, "RequestTimeoutError"), close=True)
            return
        except ClientGone:
            return
        finally:
            self.reading -= counted
        if body is None:
            await send_error(send, _too_large(self.max_body_bytes))
            return
        if counted and self._full():  # the body took its time: the places may have gone meanwhile
            await send_error(send, self._overloaded())
            return
        self.in_flight += counted
        try:
            await self.app(scope, _replay(body, receive), send)
        except ClientGone:
            return
        finally:
            self.in_flight -= counted

    def _full(self) -> bool:
        return self.max_in_flight is not None and self.in_flight >= self.max_in_flight

    def _overloaded(self) -> APIError:
        return APIError(429, f"the server is overloaded: {self.in_flight} requests are already queued or "
                             "running", "RateLimitError")

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None once it passes the limit (a chunked body has no length to check)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive):
    """A receive() that hands the app the body already read, then the connection's own events."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
