"""Forwarding one request to the chosen endpoint: retries before the first byte, streaming passed through.

Before anything reaches the client (a refused connection, a 503, a connection lost before the first
chunk, no byte of a stream within the route's first-byte timeout, no answer within the total one) the
request goes to another endpoint, at most
`max_retries` times; a 429 marks the endpoint busy for a moment (the gate sends it nothing) and the
request goes elsewhere once. Once the first chunk has gone out, a lost upstream (or the route's total
timeout) ends the stream with an OpenAI-style error event and `data: [DONE]`. A client that goes away,
at any point, closes the upstream request (the engine aborts the generation). A non-streaming answer
over BUFFER_LIMIT is relayed as it comes, with the client's backpressure, instead of held whole.

The upstream client is our own (controlplane.router.upstream): the body goes on as the client's
bytes, and past the first chunk a stream is relayed by the upstream connection's callbacks, which
write what each read brought straight to the client's socket (no task wakes per chunk).
"""

from __future__ import annotations

import asyncio
import json
import time

from controlplane.router.answer import AnswerTooLarge, Response, UpstreamError, UpstreamTimeout
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.http import Connection
from controlplane.router.upstream import Upstream

HOP_BY_HOP = {b"host", b"content-length", b"accept-encoding", b"connection", b"keep-alive",
              b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-authorization",
              b"proxy-connection", b"expect"}  # expect: answered by the router's own server
PASS_BACK = (b"content-type", b"x-request-id")
BUFFER_LIMIT = 4 * 2**20  # a larger non-streaming answer of known length is relayed, not held
MAX_HELD = 64 * 2**20  # one of unknown length (or to a sink that cannot relay) is refused above this
BUSY_SECONDS = 1.0  # after an engine's 429, no new request goes there for this long


def error_body(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def forward_headers(headers: list[tuple[bytes, bytes]], upstream_key: str | None) -> bytes:
    """The client's header lines (names lower-cased by the server) less hop-by-hop ones, as the upstream
    request's header block; the upstream key's authorization instead of the client's when given."""
    skip = HOP_BY_HOP if upstream_key is None else HOP_BY_HOP | {b"authorization"}
    out = b"".join([b"%s: %s\r\n" % (k, v) for k, v in headers if k not in skip])
    if upstream_key is not None:
        out += b"authorization: Bearer %s\r\n" % upstream_key.encode("latin-1")
    return out


async def _open(up: Upstream, url: str, path: str, body: bytes, headers: bytes,
                timeouts: tuple[float | None, float]) -> tuple[Response, bytes]:
    """The answer up to (and including) its first body chunk."""
    resp = await up.request(url, b"POST", path, headers, body, first_body=True, timeout=timeouts[1],
                            first_byte_timeout=timeouts[0])
    try:
        return resp, await resp.read_chunk()
    except BaseException:
        resp.close()
        raise


async def forward(gate: Gate, client: Upstream, p: Pending, path: str, body: bytes,
                  headers: bytes, streaming: bool, conn: Connection) -> None:
    """Sends the admitted request (p.endpoint set) and answers the client on `conn`;
    releases the endpoint. Refused (503) when no endpoint could take it."""
    try:
        await _forward(gate, client, p, path, body, headers, streaming, conn)
    except asyncio.CancelledError:  # the client went away: its endpoint is free again
        if p.endpoint is not None:
            gate.metrics.answered(p.endpoint.url, "499")
        gate.release(p)
        raise


async def _forward(gate: Gate, client: Upstream, p: Pending, path: str, body: bytes,
                   headers: bytes, streaming: bool, conn: Connection) -> None:
    m, pool = gate.metrics, gate.pool
    tried: set[str] = set()
    last = "no endpoint"
    busy_retried = False
    first_byte, total = gate.cfg.timeouts(path)
    # a non-streaming answer's first byte comes with its last: only the total bounds it
    timeouts = (first_byte if streaming else None, total)
    while p.endpoint is not None:
        ep = p.endpoint
        tried.add(ep.url)
        try:
            up, first = await _open(client, ep.url, path, body, headers, timeouts)
        except UpstreamError as exc:
            pool.failed(ep, str(exc), refused=exc.refused)
            last = f"{ep.url}: {exc}"
            reason = "refused" if exc.refused else "timeout" if isinstance(exc, UpstreamTimeout) else "lost"
        else:
            if up.status == 429 and not busy_retried:  # saturated: elsewhere once, else its answer
                ep.busy_until = time.monotonic() + BUSY_SECONDS
                busy_retried = True
                others = gate.retry_target(p, tried)
                if others is not None:
                    up.close()
                    m.retries.labels("busy").inc()
                    continue
                gate.take(ep, p)  # none free: the engine's 429 goes to the client
            if up.status != 503:
                pool.succeeded(ep)
                return await _answer(gate, p, up, first, streaming, conn)
            up.close()
            pool.failed(ep, "503")
            last, reason = f"{ep.url}: 503", "unavailable"
        if len(tried) > gate.cfg.max_retries or gate.retry_target(p, tried) is None:
            break
        m.retries.labels(reason).inc()
    gate.release(p)
    raise Refused(503, f"no endpoint could take the request ({last})", "ServiceUnavailableError")


def _content_length(up: Response) -> int | None:
    for k, v in up.headers:
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


async def _answer(gate: Gate, p: Pending, up: Response, first: bytes, streaming: bool,
                  conn: Connection) -> None:
    m, ep = gate.metrics, p.endpoint
    status = up.status
    m.first_byte(p, streaming, time.monotonic() - p.arrived)
    headers = [(k.lower(), v) for k, v in up.headers if k.lower() in PASS_BACK]
    if streaming and status == 200:
        return await _relay(gate, p, up, first, conn, headers, None)
    length = _content_length(up)
    if not up.complete and length is not None and length > BUFFER_LIMIT and hasattr(conn, "start_sized"):
        return await _relay(gate, p, up, first, conn, headers, length)  # too large to hold
    try:
        rest = first + await up.read_all(MAX_HELD)
    except UpstreamError as exc:
        rest, why = None, exc
    finally:
        up.close()
        gate.release(p)
    if rest is None:  # nothing has gone to the client yet
        if isinstance(why, AnswerTooLarge):
            raise Refused(502, str(why), "APIConnectionError")
        gate.pool.failed(ep, "lost mid-answer")
        raise Refused(502, "the endpoint failed mid-answer", "APIConnectionError")
    m.answered(ep.url, str(status))
    if status >= 400:
        m.errors.labels(p.model, str(p.priority), str(status)).inc()
    conn.respond(status, headers, rest)


async def _relay(gate: Gate, p: Pending, up: Response, first: bytes, conn: Connection,
                 headers: list, length: int | None) -> None:
    """The rest of the answer to the client as it arrives, the endpoint's socket read only as fast as
    the client's takes it: a stream (length None; an SSE error event if the endpoint fails), or a
    non-streaming answer of `length` bytes (cut off by closing, if the endpoint fails)."""
    m, ep, status = gate.metrics, p.endpoint, up.status
    code = str(status)
    try:
        if up.complete:
            conn.start_stream(status, headers)
            return conn.end_stream(first)
        if length is None:
            conn.start_stream(status, headers, first)
        else:
            conn.start_sized(status, headers, length, first)
        up.tail = first
        conn.on_close = up.close  # the client leaving ends the upstream request (the engine aborts)
        if conn.closed:  # it left before its first byte (while queued or waiting for the engine)
            up.close()
        error = await up.relay(conn)  # the rest, chunk by chunk, from the upstream's callbacks
        if error is not None and not conn.closed:  # the endpoint went away mid-answer (not the client)
            code = "stream_error"
            gate.pool.failed(ep, f"stream: {error}")
            m.errors.labels(p.model, str(p.priority), "stream_error").inc()
            if length is not None:  # a sized answer has no room for an error event: the cut says it
                conn.transport.close()
                return
            sep = b"" if up.tail.endswith(b"\n\n") else b"\n\n"
            err = error_body(f"the endpoint failed mid-stream ({error})", "APIConnectionError", 502)
            conn.end_stream(sep + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
    finally:
        conn.on_close = None
        m.answered(ep.url, code)
        up.close()
        gate.release(p)
