"""Forwarding one request to the chosen endpoint: retries before the first byte, streaming passed through.

Before anything reaches the client (a refused connection, a 503, a connection lost before the first
chunk) the request goes to another endpoint, at most `max_retries` times. Once the first chunk has
gone out, a lost upstream ends the stream with an OpenAI-style error event and `data: [DONE]`; a
client gone mid-stream closes the upstream request (the engine aborts the generation).

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

from controlplane.router.gate import Gate, Pending, Refused

HOP_BY_HOP = {"host", "content-length", "accept-encoding", "connection", "keep-alive", "transfer-encoding",
              "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection"}
PASS_BACK = ("content-type", "x-request-id")


def error_body(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def respond(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole answer through ASGI `send`."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def forward_headers(headers: dict[str, str], upstream_key: str | None) -> dict[str, str]:
    """The client's headers (lower-case names) less hop-by-hop ones; the upstream key when given."""
    out = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
    if upstream_key is not None:
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
                  headers: dict, streaming: bool, send, receive) -> None:
    """Sends the admitted request (p.endpoint set) and answers the client through ASGI `send`;
    releases the endpoint. Refused (503) when no endpoint could take it."""
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
                return await _answer(gate, p, up, streaming, send, receive)
            up.resp.close()
            pool.failed(ep, "503")
            last, reason = f"{ep.url}: 503", "unavailable"
        if len(tried) > gate.cfg.max_retries or gate.retry_target(p, tried) is None:
            break
        m.retries.labels(reason).inc()
    gate.release(p)
    raise Refused(503, f"no endpoint could take the request ({last})", "ServiceUnavailableError")


async def _answer(gate: Gate, p: Pending, up: Upstream, streaming: bool, send, receive) -> None:
    m, ep = gate.metrics, p.endpoint
    status = up.status
    m.first_byte(p, streaming, time.monotonic() - p.arrived)
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in up.resp.headers.items()
               if k.lower() in PASS_BACK]
    if not (streaming and status == 200):
        try:
            rest = [up.first] + [c async for c in up.chunks]
        finally:
            up.resp.close()
            gate.release(p)
        m.answered(ep.url, str(status))
        if status >= 400:
            m.errors.labels(p.model, str(p.priority), str(status)).inc()
        return await respond(send, status, b"".join(rest), headers)

    gone = asyncio.ensure_future(_disconnect(receive, up.resp))  # the client leaving ends the stream
    code = "200"
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": up.first, "more_body": True})
        tail = up.first
        try:
            async for chunk in up.chunks:
                if chunk:
                    tail = chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_ERRORS as exc:
            if not gone.done():  # the endpoint went away mid-stream (not the client)
                code = "stream_error"
                gate.pool.failed(ep, f"stream: {type(exc).__name__}")
                m.errors.labels(p.model, str(p.priority), "stream_error").inc()
                sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
                why = f"the endpoint failed mid-stream ({type(exc).__name__})"
                err = error_body(why, "APIConnectionError", 502)
                await send({"type": "http.response.body", "more_body": True,
                            "body": sep + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        gone.cancel()
        m.answered(ep.url, code)
        up.resp.close()
        gate.release(p)


async def _disconnect(receive, resp: aiohttp.ClientResponse) -> None:
    """Waits for the client to disconnect, then closes the upstream response."""
    while (await receive())["type"] != "http.disconnect":
        pass
    resp.close()
