"""Forwarding one request to the chosen endpoint: retries before the first byte, streaming passed through.

Before anything reaches the client (a refused connection, a 503, a connection lost before the first
chunk) the request goes to another endpoint, at most `max_retries` times. Once the first chunk has
gone out, a lost upstream ends the stream with an OpenAI-style error event and `data: [DONE]`.

The upstream client is aiohttp's: httpx's connection pool scans every pooled connection for each
request (quadratic in the connections open), which at a few hundred concurrent streams cost the
router milliseconds of CPU per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
from starlette.responses import Response, StreamingResponse

from controlplane.router.gate import Gate, Pending, Refused

HOP_BY_HOP = {"host", "content-length", "accept-encoding", "connection", "keep-alive", "transfer-encoding",
              "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection"}
PASS_BACK = ("content-type", "x-request-id")


def error_body(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(status: int, message: str, kind: str) -> Response:
    return Response(json.dumps(error_body(message, kind, status)), status, media_type="application/json")


def forward_headers(headers, upstream_key: str | None) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
    if upstream_key is not None:
        out = {k: v for k, v in out.items() if k.lower() != "authorization"}
        out["authorization"] = f"Bearer {upstream_key}"
    return out


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def upstream_session(connect_timeout: float) -> aiohttp.ClientSession:
    """The proxy's client: no pool limit, no total timeout (a generation takes what it takes)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
                                 auto_decompress=False, skip_auto_headers=("User-Agent",))


class Upstream:
    """An answer read from an endpoint up to (and including) its first body chunk."""

    def __init__(self, resp: aiohttp.ClientResponse, chunks: AsyncIterator[bytes], first: bytes):
        self.resp, self.chunks, self.first = resp, chunks, first
        self.status = resp.status


async def _open(session: aiohttp.ClientSession, url: str, path: str, body: bytes, headers: dict) -> Upstream:
    resp = await session.post(url + path, data=body, headers=headers)
    try:
        chunks = resp.content.iter_any()
        first = b""
        async for chunk in chunks:
            if chunk:
                first = chunk
                break
        return Upstream(resp, chunks, first)
    except BaseException:
        resp.close()
        raise


async def forward(gate: Gate, client: aiohttp.ClientSession, p: Pending, path: str, body: bytes,
                  headers: dict, streaming: bool) -> Response:
    """Sends the admitted request (p.endpoint set) and answers the client; releases the endpoint."""
    m, pool = gate.metrics, gate.pool
    tried: set[str] = set()
    last = "no endpoint"
    while p.endpoint is not None:
        ep = p.endpoint
        tried.add(ep.url)
        try:
            up = await _open(client, ep.url, path, body, headers)
        except UPSTREAM_ERRORS as exc:
            refused = isinstance(exc, aiohttp.ClientConnectorError)
            pool.failed(ep, f"{type(exc).__name__}: {exc}", refused=refused)
            last = f"{ep.url}: {type(exc).__name__}"
            reason = "refused" if refused else "lost"
        else:
            if up.status != 503:
                pool.succeeded(ep)
                return await _answer(gate, p, up, streaming)
            up.resp.close()
            pool.failed(ep, "503")
            last, reason = f"{ep.url}: 503", "unavailable"
        if len(tried) > gate.cfg.max_retries or gate.retry_target(p, tried) is None:
            break
        m.retries.labels(reason).inc()
    gate.release(p)
    raise Refused(503, f"no endpoint could take the request ({last})", "ServiceUnavailableError")


async def _answer(gate: Gate, p: Pending, up: Upstream, streaming: bool) -> Response:
    m, ep = gate.metrics, p.endpoint
    status = up.status
    m.ttft.labels(p.model, str(p.priority), str(streaming).lower()).observe(time.monotonic() - p.arrived)
    headers = {k: v for k, v in up.resp.headers.items() if k.lower() in PASS_BACK}
    if not (streaming and status == 200):
        try:
            rest = [up.first] + [c async for c in up.chunks]
        finally:
            up.resp.close()
            gate.release(p)
        m.answers.labels(ep.url, str(status)).inc()
        if status >= 400:
            m.errors.labels(p.model, str(p.priority), str(status)).inc()
        return Response(b"".join(rest), status, headers=headers)

    async def relay() -> AsyncIterator[bytes]:
        tail = up.first
        code = "200"
        try:
            yield up.first
            async for chunk in up.chunks:
                if chunk:
                    tail = chunk
                    yield chunk
        except UPSTREAM_ERRORS as exc:  # the endpoint went away mid-stream
            code = "stream_error"
            gate.pool.failed(ep, f"stream: {type(exc).__name__}")
            m.errors.labels(p.model, str(p.priority), "stream_error").inc()
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            err = error_body(f"the endpoint failed mid-stream ({type(exc).__name__})", "APIConnectionError",
                             502)
            yield sep + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        finally:
            m.answers.labels(ep.url, code).inc()
            up.resp.close()  # a client gone mid-stream closes the upstream too: the engine aborts
            gate.release(p)

    return StreamingResponse(relay(), status, headers=headers, media_type=headers.get("content-type"))
