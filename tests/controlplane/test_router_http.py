"""The router's HTTP server (controlplane.router.http) on raw sockets: keep-alive and pipelined
requests answered in order, HEAD, a body over the limit, a malformed request, a failing handler,
Expect: 100-continue, and a client gone mid-stream reported through on_close."""

from __future__ import annotations

import asyncio

from controlplane.router import http
from controlplane.router.http import Connection, Request


async def handle(req: Request, conn: Connection) -> None:
    if req.path == "/boom":
        raise RuntimeError("a bug")
    if req.path == "/stream":
        conn.start_stream(200, [(b"content-type", b"text/event-stream")], b"data: 1\n\n")
        gone = asyncio.get_running_loop().create_future()
        conn.on_close = lambda: gone.set_result(True)
        conn.send_chunk(b"data: 2\n\n")
        await asyncio.wait_for(gone, 5)
        handle.gone = True
        return
    big = b"big" if req.too_large else b""
    body = b"%s %s %d %s" % (req.method.encode(), req.path.encode(), len(req.body), big)
    conn.respond(200, [(b"content-type", b"text/plain")], body, head_only=req.method == "HEAD")


async def with_server(script):
    loop = asyncio.get_running_loop()
    conns: set = set()
    srv = await loop.create_server(lambda: Connection(handle, conns), "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
        await script(reader, writer)
        writer.close()
    finally:
        srv.close()


async def answer(reader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.startswith(b"content-length"))
    return head, await reader.readexactly(length)


def test_pipelined_keep_alive_head_and_limits(monkeypatch):
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 10)

    async def script(reader, writer):
        writer.write(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"
                     b"HEAD /b HTTP/1.1\r\nhost: x\r\n\r\n"
                     b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n\r\n" + b"x" * 20)
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"POST /a 3 "
        head = await reader.readuntil(b"\r\n\r\n")  # HEAD: the length, no body
        assert b"content-length: 10\r\n" in head
        _, body = await answer(reader)
        assert body == b"POST /c 0 big"  # over the limit: flagged, not kept
        writer.write(b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n")
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 500") and body == b"Internal Server Error"

    asyncio.run(with_server(script))


def test_malformed_request_and_expect_continue():
    async def script(reader, writer):
        writer.write(b"POST /e HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hi")
        _, body = await answer(reader)
        assert body == b"POST /e 2 "
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        head, _ = await answer(reader)
        assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head
        assert await reader.read() == b""  # closed

    asyncio.run(with_server(script))


def test_client_gone_mid_stream_is_reported():
    handle.gone = False

    async def script(reader, writer):
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head
        assert await reader.readuntil(b"data: 2\n\n\r\n") == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n"
        writer.close()
        for _ in range(100):
            if handle.gone:
                break
            await asyncio.sleep(0.02)
        assert handle.gone

    asyncio.run(with_server(script))


def test_http10_client_gets_an_unframed_stream_ended_by_close():
    async def stream(req: Request, conn: Connection) -> None:
        conn.start_stream(200, [], b"data: 1\n\n")
        conn.send_chunk(b"data: 2\n\n")
        conn.end_stream(b"data: [DONE]\n\n")

    async def main():
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: Connection(stream, set()), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
        writer.write(b"GET /s HTTP/1.0\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closes
        writer.close()
        srv.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head and b"connection: close" in head
        assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"

    asyncio.run(main())
