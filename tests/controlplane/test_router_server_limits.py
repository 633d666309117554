"""Issue findings 2 and 3: the router's own HTTP server held idle, HTTP/0.9, slow-header and slow-body
clients for ever, accepted 10 MB URLs and 300 MB headers (at a super-linear cost that starved
/health and the scrapes), and ran out of descriptors under a flood of idle connections. Now each
phase has a timeout (408 or a close), a long URL gets 414 and a large head 431 before the parser has
buffered more than the limit, and past the connection cap a new connection gets a clear 503; the
next good request is served each time. Also: a malformed request pipelined after a good one no
longer loses the good one's answer, an Upgrade or CONNECT gets an answer, and a chunked body's
trailer fields are not request headers."""

from __future__ import annotations

import resource
import socket
import threading
import time

import httpx
import pytest

from controlplane.router.http import Connection, Request
from controlplane.router.httpserver import HttpServer
from controlplane.router.limits import ServerLimits
from controlplane.router.proxy import forward_headers

LIMITS = ServerLimits(header_timeout=0.6, body_timeout=0.6, idle_timeout=0.6, max_url_bytes=8192,
                      max_head_bytes=65536, max_headers=100, max_connections=60)


async def handle(req: Request, conn: Connection) -> None:
    names = b",".join(k for k, _ in req.headers)
    conn.respond(200, [(b"content-type", b"text/plain")], b"%s %s %d %s" % (
        req.method.encode(), req.path.encode(), len(req.body), names))


async def nothing() -> None:
    pass


@pytest.fixture
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = HttpServer(handle, nothing, nothing, "127.0.0.1", port, LIMITS)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield srv
    srv.should_exit = True
    t.join(10)


def connect(srv) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    return s


def read_all(s: socket.socket, limit: float = 5.0) -> bytes:
    s.settimeout(limit)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def good(srv) -> bytes:
    with connect(srv) as s:
        s.sendall(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        return read_all(s)


def test_idle_slow_and_http09_clients_are_closed(server):
    clients = []
    for _ in range(40):  # slowloris: a header line every 0.2 s, never finished
        s = connect(server)
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")
        clients.append(("slow-header", s))
    for kind, first in [("idle", b""), ("http09", b"GET /\r\n"),
                        ("slow-body", b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab")]:
        s = connect(server)
        if first:
            s.sendall(first)
        clients.append((kind, s))
    keep = connect(server)  # a keep-alive client that goes quiet after one answer
    keep.sendall(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
    assert keep.recv(1000).startswith(b"HTTP/1.1 200")
    clients.append(("idle-keep-alive", keep))
    t0 = time.monotonic()
    for _ in range(4):
        time.sleep(0.2)
        for kind, s in clients:
            if kind == "slow-header":
                try:
                    s.sendall(b"x-a: b\r\n")
                except OSError:
                    pass
    answers = {kind: read_all(s) for kind, s in clients}
    closed_after = time.monotonic() - t0
    assert closed_after < 3.0  # 0.6 s timeouts, swept every 0.5 s
    assert answers["slow-header"].startswith(b"HTTP/1.1 408")
    assert answers["slow-body"].startswith(b"HTTP/1.1 408")
    assert answers["idle"] == b"" and answers["idle-keep-alive"] == b""
    assert answers["http09"].startswith(b"HTTP/1.1 408")
    for _, s in clients:
        s.close()
    deadline = time.monotonic() + 3
    while server.conns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.conns
    assert good(server).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("url_mb", [1, 10])
def test_a_long_url_gets_414_without_reading_it_all(server, url_mb):
    with connect(server) as s:
        s.sendall(b"GET /" + b"a" * 4096)
        sent = 4096
        try:
            while sent < url_mb * 2**20:
                s.sendall(b"a" * 65536)
                sent += 65536
        except OSError:  # the server answered and closed
            pass
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 414"), answer[:100]
    assert len(answer) < 500  # not echoed back in a 404
    assert good(server).startswith(b"HTTP/1.1 200")


def test_a_huge_header_gets_431_at_flat_cost_while_health_stays_fast(server):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: ")
        sent = 0
        try:
            while sent < 300 * 2**20:
                s.sendall(b"b" * 2**20)
                sent += 2**20
        except OSError:
            pass
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    assert time.monotonic() - t0 < 5 and sent < 50 * 2**20  # refused early, not after 300 MB
    t1 = time.monotonic()
    assert good(server).startswith(b"HTTP/1.1 200") and time.monotonic() - t1 < 1.0
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024 < 50  # MB
    with connect(server) as s:  # too many header fields
        fields = b"".join(b"x-%d: 1\r\n" % i for i in range(150))
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n" + fields + b"\r\n")
        assert read_all(s).startswith(b"HTTP/1.1 431")


def test_past_the_connection_cap_new_connections_get_503_and_the_rest_are_served(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard  # raised at start
    assert server.cap == 60
    held = [connect(server) for _ in range(60)]
    time.sleep(0.2)
    refused = [connect(server) for _ in range(5)]
    for s in refused:
        assert read_all(s).startswith(b"HTTP/1.1 503")
        s.close()
    assert good(server).startswith(b"HTTP/1.1 503")  # at the cap: refused clearly, not hung
    for s in held[:10]:
        s.close()
    time.sleep(0.2)
    assert good(server).startswith(b"HTTP/1.1 200")
    for s in held[10:]:
        s.close()


def test_pipelined_garbage_after_a_good_request_keeps_its_answer(server):
    with connect(server) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 400" in answer


@pytest.mark.parametrize("request_", [
    b"GET /up HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
    b"http2-settings: AAMAAABkAAQAAP__\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
])
def test_upgrade_and_connect_get_a_status(server, request_):
    with connect(server) as s:
        s.sendall(request_)
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer  # then closed


def test_trailers_and_expect_are_not_forwarded(server):
    with connect(server) as s:
        s.sendall(b"POST /t HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                  b"2\r\nhi\r\n0\r\nx-trailer: evil\r\n\r\n")
        answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 200") and b"x-trailer" not in answer and b"POST /t 2" in answer
    assert b"expect" not in forward_headers([(b"expect", b"100-continue"), (b"x-a", b"1")], None)


def test_at_the_cap_the_router_keeps_scraping_its_engines():
    from controlplane.router.app import build_router_app
    from controlplane.router.discovery import static
    from controlplane.router.server import RouterServer
    from routing.config import RouterConfig
    from tests.fake_engine import FakeEngine

    engines = [FakeEngine(chunk_delay=0.001).start() for _ in range(2)]
    app = build_router_app(RouterConfig(refresh_interval=0.05), static([e.url for e in engines]))
    try:
        with RouterServer(app, limits=ServerLimits(max_connections=40, header_timeout=30)) as r:
            held = [socket.create_connection(("127.0.0.1", r.port)) for _ in range(60)]
            time.sleep(1.0)  # twenty refresh rounds at the cap
            pool = r.state.pool
            assert len(pool.routable()) == 2 and all(e.failures == 0 for e in pool.endpoints.values())
            assert sum(read_all(s, 2).startswith(b"HTTP/1.1 503") for s in held[40:]) == 20
            for s in held:
                s.close()
            time.sleep(0.2)
            assert httpx.post(r.url + "/v1/completions", json={"prompt": "x"}, timeout=5).status_code == 200
    finally:
        for e in engines:
            e.stop()
