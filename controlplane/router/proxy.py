"""Forwarding one request to the chosen endpoint: retries before the first byte, streaming passed through.

Before anything reaches the client (a refused connection, a 503, a connection lost before the first
chunk) the request goes to another endpoint, at most `max_retries` times. Once the first chunk has
gone out, a lost upstream ends the stream with an OpenAI-style error event and `data: [DONE]`; a
client gone mid-stream closes the upstream request (the engine aborts the generation).

The upstream client is our own (controlplane.router.upstream): the body goes on as the client's
bytes, and past the first chunk a stream is relayed by the upstream connection's callbacks, which
write what each read brought straight to the client's socket (no task wakes per chunk).
"""

from __future__ import annotations

import json
import time

from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.http import Connection
from controlplane.router.upstream import Response, Upstream, UpstreamError

HOP_BY_HOP = {b"host", b"content-length", b"accept-encoding", b"connection", b"keep-alive",
              b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-authorization",
              b"proxy-connection"}
PASS_BACK = (b"content-type", b"x-request-id")


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


async def _open(up: Upstream, url: str, path: str, body: bytes, headers: bytes) -> tuple[Response, bytes]:
    """The answer up to (and including) its first body chunk."""
    resp = await up.request(url, b"POST", path, headers, body, first_body=True)
    try:
        return resp, await resp.read_chunk()
    except BaseException:
        resp.close()
        raise


async def forward(gate: Gate, client: Upstream, p: Pending, path: str, body: bytes,
                  headers: bytes, streaming: bool, conn: Connection) -> None:
    """Sends the admitted request (p.endpoint set) and answers the client on `conn`;
    releases the endpoint. Refused (503) when no endpoint could take it."""
    m, pool = gate.metrics, gate.pool
    tried: set[str] = set()
    last = "no endpoint"
    while p.endpoint is not None:
        ep = p.endpoint
        tried.add(ep.url)
        try:
            up, first = await _open(client, ep.url, path, body, headers)
        except UpstreamError as exc:
            pool.failed(ep, str(exc), refused=exc.refused)
            last = f"{ep.url}: {exc}"
            reason = "refused" if exc.refused else "lost"
        else:
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


async def _answer(gate: Gate, p: Pending, up: Response, first: bytes, streaming: bool,
                  conn: Connection) -> None:
    m, ep = gate.metrics, p.endpoint
    status = up.status
    m.first_byte(p, streaming, time.monotonic() - p.arrived)
    headers = [(k.lower(), v) for k, v in up.headers if k.lower() in PASS_BACK]
    if not (streaming and status == 200):
        try:
            rest = first + await up.read_all()
        except UpstreamError:
            rest = None
        finally:
            up.close()
            gate.release(p)
        if rest is None:  # the answer broke off: nothing has gone to the client yet
            gate.pool.failed(ep, "lost mid-answer")
            raise Refused(502, "the endpoint failed mid-answer", "APIConnectionError")
        m.answered(ep.url, str(status))
        if status >= 400:
            m.errors.labels(p.model, str(p.priority), str(status)).inc()
        return conn.respond(status, headers, rest)

    code = "200"
    try:
        if up.complete:
            conn.start_stream(status, headers)
            return conn.end_stream(first)
        conn.start_stream(status, headers, first)
        up.tail = first
        conn.on_close = up.close  # the client leaving ends the upstream request (the engine aborts)
        if conn.closed:  # it left before its first byte (while queued or waiting for the engine)
            up.close()
        error = await up.relay(conn)  # the rest, chunk by chunk, from the upstream's callbacks
        if error is not None and not conn.closed:  # the endpoint went away mid-stream (not the client)
            code = "stream_error"
            gate.pool.failed(ep, f"stream: {error}")
            m.errors.labels(p.model, str(p.priority), "stream_error").inc()
            sep = b"" if up.tail.endswith(b"\n\n") else b"\n\n"
            err = error_body(f"the endpoint failed mid-stream ({error})", "APIConnectionError", 502)
            conn.end_stream(sep + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
    finally:
        conn.on_close = None
        m.answered(ep.url, code)
        up.close()
        gate.release(p)
