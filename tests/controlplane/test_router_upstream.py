"""The router's upstream client (controlplane.router.upstream) against a scripted HTTP/1.1 server:
chunked and sized answers, keep-alive reuse, a stale idle connection, refused and broken connections,
timeouts, and a stream closed early."""

from __future__ import annotations

import asyncio
import socket

import pytest

from controlplane.router.answer import UpstreamError
from controlplane.router.upstream import Upstream


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def serve(answer, connections: list):
    """A server that reads one request head (and its content-length body) at a time and lets
    `answer(request, writer)` reply; `connections` collects one entry per accepted connection."""
    async def handle(reader, writer):
        connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                if await answer(head + body, writer) == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_streamed_and_sized_answers_on_one_kept_alive_connection():
    seen: list[bytes] = []

    async def answer(request, w):
        seen.append(request)
        if request.startswith(b"POST"):
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n")
            for part in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                w.write(chunked(part)[:-5])  # one chunk at a time, the terminator last
                await w.drain()
                await asyncio.sleep(0.01)
            w.write(b"0\r\n\r\n")
        else:
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nnope!")

    async def main():
        conns: list = []
        server, url = await serve(answer, conns)
        up = Upstream(connect_timeout=2)
        r = await up.request(url, b"POST", "/v1/completions", b"authorization: Bearer k\r\n", b'{"a": 1}')
        assert r.status == 200 and (b"content-type", b"text/event-stream") in r.headers
        chunks = []
        while chunk := await r.read_chunk():
            chunks.append(chunk)
        assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n" and len(chunks) >= 2
        assert r.complete
        assert await up.get(url, "/nothing", timeout=2) == (404, b"nope!")
        assert len(conns) == 1  # the second request reused the first connection
        up.close()
        server.close()

    run(main())
    assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 8\r\nauthorization: Bearer k\r\n\r\n{\"a\": 1}" in seen[0]


def test_a_stale_idle_connection_is_replaced_without_an_error():
    async def answer(request, w):
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return "close"  # the server closes after each answer, without saying so

    async def main():
        conns: list = []
        server, url = await serve(answer, conns)
        up = Upstream(connect_timeout=2)
        assert await up.get(url, "/a", timeout=2) == (200, b"ok")
        assert await up.get(url, "/b", timeout=2) == (200, b"ok")
        assert len(conns) == 2
        server.close()

    run(main())


def test_refused_broken_and_slow():
    async def answer(request, w):
        if b"/broken" in request:
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"data: 1\n\n")[:-5])
            await w.drain()
            return "close"  # mid-stream
        await asyncio.sleep(5)  # /slow

    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        up = Upstream(connect_timeout=2)
        with pytest.raises(UpstreamError) as refused:
            await up.request(dead, b"POST", "/", b"", b"{}")
        assert refused.value.refused
        conns: list = []
        server, url = await serve(answer, conns)
        r = await up.request(url, b"POST", "/broken", b"", b"{}")
        assert await r.read_chunk() == b"data: 1\n\n"
        with pytest.raises(UpstreamError) as lost:
            await r.read_chunk()
        assert not lost.value.refused
        with pytest.raises(UpstreamError, match="within 0.2 s"):
            await up.get(url, "/slow", timeout=0.2)
        server.close()

    run(main())


def test_closing_a_stream_early_closes_its_connection():
    async def main():
        gone = asyncio.Event()

        async def answer(request, w):
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"x")[:-5])
            await w.drain()
            try:
                while True:  # the client stops reading: the next writes fail once it has closed
                    await asyncio.sleep(0.02)
                    w.write(chunked(b"y")[:-5])
                    await w.drain()
            except ConnectionError:
                gone.set()
            return "close"

        server, url = await serve(answer, [])
        up = Upstream(connect_timeout=2)
        r = await up.request(url, b"POST", "/", b"", b"{}")
        assert await r.read_chunk() == b"x"
        r.close()
        await asyncio.wait_for(gone.wait(), 5)
        assert not up._idle.get(up._key(url)[:2])  # not kept for reuse
        server.close()

    run(main())
