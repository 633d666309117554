"""Forwarding one request to the chosen endpoint: retries before the first byte, streaming passed through.

Before anything reaches the client (a refused connection, a 503, a connection lost before the first
chunk) the request goes to another endpoint, at most `max_retries` times. Once the first chunk has
gone out, a lost upstream ends the stream with an OpenAI-style error event and `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import httpx
from starlette.responses import Response, StreamingResponse

from controlplane.router.gate import Gate, Pending, Refused

HOP_BY_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
              "upgrade", "proxy-authorization", "proxy-connection"}
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


class Upstream:
    """An answer read from an endpoint up to (and including) its first body chunk."""

    def __init__(self, resp: httpx.Response, chunks: AsyncIterator[bytes], first: bytes):
        self.resp, self.chunks, self.first = resp, chunks, first


async def _open(client: httpx.AsyncClient, url: str, path: str, body: bytes, headers: dict) -> Upstream:
    req = client.build_request("POST", url + path, content=body, headers=headers)
    resp = await client.send(req, stream=True)
    try:
        chunks = resp.aiter_raw()
        first = b""
        async for chunk in chunks:
            if chunk:
                first = chunk
                break
        return Upstream(resp, chunks, first)
    except BaseException:
        await resp.aclose()
        raise


async def forward(gate: Gate, client: httpx.AsyncClient, p: Pending, path: str, body: bytes, headers: dict,
                  streaming: bool) -> Response:
    """Sends the admitted request (p.endpoint set) and answers the client; releases the endpoint."""
    m, pool = gate.metrics, gate.pool
    tried: set[str] = set()
    last = "no endpoint"
    while p.endpoint is not None:
        ep = p.endpoint
        tried.add(ep.url)
        try:
            up = await _open(client, ep.url, path, body, headers)
        except httpx.HTTPError as exc:
            refused = isinstance(exc, httpx.ConnectError)
            pool.failed(ep, f"{type(exc).__name__}: {exc}", refused=refused)
            last = f"{ep.url}: {type(exc).__name__}"
            reason = "refused" if refused else "lost"
        else:
            if up.resp.status_code != 503:
                pool.succeeded(ep)
                return await _answer(gate, p, up, streaming)
            await up.resp.aclose()
            pool.failed(ep, "503")
            last, reason = f"{ep.url}: 503", "unavailable"
        if len(tried) > gate.cfg.max_retries or gate.retry_target(p, tried) is None:
            break
        m.retries.labels(reason).inc()
    gate.release(p)
    raise Refused(503, f"no endpoint could take the request ({last})", "ServiceUnavailableError")


async def _answer(gate: Gate, p: Pending, up: Upstream, streaming: bool) -> Response:
    m, ep = gate.metrics, p.endpoint
    status = up.resp.status_code
    m.ttft.labels(p.model, str(p.priority), str(streaming).lower()).observe(time.monotonic() - p.arrived)
    headers = {k: v for k, v in up.resp.headers.items() if k.lower() in PASS_BACK}
    if not (streaming and status == 200):
        try:
            rest = [up.first] + [c async for c in up.chunks]
        finally:
            await up.resp.aclose()
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
        except httpx.HTTPError as exc:  # the endpoint went away mid-stream
            code = "stream_error"
            gate.pool.failed(ep, f"stream: {type(exc).__name__}")
            m.errors.labels(p.model, str(p.priority), "stream_error").inc()
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            err = error_body(f"the endpoint failed mid-stream ({type(exc).__name__})", "APIConnectionError",
                             502)
            yield sep + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        finally:
            m.answers.labels(ep.url, code).inc()
            await up.resp.aclose()
            gate.release(p)

    return StreamingResponse(relay(), status, headers=headers, media_type=headers.get("content-type"))
