"""Issue findings 5, 4 (the router's side) and 6: an engine that accepts and never answers held the
client for 130 s; streaming clients leaving before the first byte left in-flight requests and
descriptors behind for good; a non-streaming client that left was not passed on; a 429 from an engine
was neither counted nor retried; a 1 GiB non-streaming answer was held whole (2 GB RSS). Now a
first-byte timeout sends the request elsewhere, a client leaving at any point closes the engine's
request, a 429 marks the engine busy and goes elsewhere once, and large answers are relayed at the
client's pace."""

from __future__ import annotations

import os
import socket
import time

import httpx
import pytest

from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.server import RouterServer
from routing.config import RouterConfig, load_router_config
from tests.fake_engine import FakeEngine

BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}


def router(engines, **cfg) -> RouterServer:
    return RouterServer(build_router_app(RouterConfig(refresh_interval=0.05, **cfg),
                                         static([e.url for e in engines]))).start()


@pytest.fixture
def pair():
    es = [FakeEngine(chunk_delay=0.01).start() for _ in range(2)]
    yield es
    for e in es:
        e.stop()


def wait_for(cond, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_timeouts_come_from_the_config_per_route():
    cfg = load_router_config({"kind": "EndpointPickerConfig", "timeouts": {
        "firstByte": "2s", "total": "1m", "routes": {"/v1/chat/completions": {"firstByte": "500ms"}}}})
    assert cfg.timeouts("/v1/completions") == (2.0, 60.0)
    assert cfg.timeouts("/v1/chat/completions") == (0.5, 60.0)


def test_a_hanging_engine_is_timed_out_and_the_request_served_elsewhere(pair):
    hang, ok = pair
    hang.mode = "hang"
    with router(pair, first_byte_timeout=0.5, total_timeout=1.0, eject_after=100) as r, \
            httpx.Client(timeout=10) as c:
        for _ in range(6):  # a stream: its first byte is due within 0.5 s
            t0 = time.monotonic()
            resp = c.post(r.url + "/v1/completions", json={**BODY, "stream": True})
            assert resp.status_code == 200 and "t4" in resp.text
            assert time.monotonic() - t0 < 2.0  # at most one first-byte timeout, not 130 s
        for _ in range(4):  # not streaming: the first byte comes with the last, so the total bounds it
            t0 = time.monotonic()
            resp = c.post(r.url + "/v1/completions", json=BODY)
            assert resp.status_code == 200 and resp.json()["port"] == ok.port
            assert time.monotonic() - t0 < 2.5
        assert hang.requests >= 1 and wait_for(lambda: hang.active == 0)  # the engine saw each one go
        assert 'slopilot_router_retries_total{reason="timeout"}' in c.get(r.url + "/metrics").text
        ok.mode = "hang"  # nowhere to go: a 503 after the timeouts, not a hang
        t0 = time.monotonic()
        assert c.post(r.url + "/v1/completions", json=BODY).status_code == 503
        assert time.monotonic() - t0 < 3.0
        ok.mode = "ok"
        assert c.post(r.url + "/v1/completions", json={**BODY, "stream": True}).status_code == 200


def test_a_stream_past_its_total_timeout_ends_with_an_error_event(pair):
    slow, _ = pair
    slow.chunks, slow.chunk_delay = 1000, 0.05
    with router([slow], total_timeout=0.5) as r, httpx.Client(timeout=10) as c:
        text = c.post(r.url + "/v1/completions", json={**BODY, "stream": True}).text
        assert "within 0.5 s" in text and text.endswith("data: [DONE]\n\n")
        assert wait_for(lambda: slow.active == 0)


def test_clients_leaving_before_the_first_byte_leave_nothing_behind(pair):
    a, b = pair
    for e in pair:
        e.first_delay = 1.0
    with router(pair) as r:
        time.sleep(0.3)
        before = fds()
        clients = []
        for i in range(100):
            s = socket.create_connection(("127.0.0.1", r.port))
            body = b'{"model": "m", "prompt": "x", "stream": %s}' % (b"true" if i % 2 else b"false")
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(body), body))
            clients.append(s)
        assert wait_for(lambda: a.active + b.active == 100)
        for s in clients:
            s.close()  # before the first byte: streaming and not alike
        assert wait_for(lambda: a.active + b.active == 0, 3.0)  # passed on at once, not after 1 s
        assert a.aborted + b.aborted == 100 and a.served + b.served == 0
        pool = r.state.pool
        assert wait_for(lambda: all(e.outstanding == 0 for e in pool.endpoints.values()))
        assert wait_for(lambda: fds() <= before + 4)  # no descriptor left open (kept-alive ones aside)
        for e in pair:
            e.first_delay = 0.0
        assert httpx.post(r.url + "/v1/completions", json=BODY, timeout=5).status_code == 200


def test_a_429_marks_the_engine_busy_and_goes_elsewhere_once(pair):
    busy, ok = pair
    busy.mode = "429"
    with router(pair) as r, httpx.Client(timeout=10) as c:
        codes = [c.post(r.url + "/v1/completions", json=BODY).status_code for _ in range(20)]
        assert codes == [200] * 20
        assert r.state.pool.endpoints[busy.url].busy_until > time.monotonic() - 2
        assert 'slopilot_router_retries_total{reason="busy"}' in c.get(r.url + "/metrics").text
        ok.mode = "429"  # both busy: the engines' 429 reaches the client
        time.sleep(1.1)
        assert c.post(r.url + "/v1/completions", json=BODY).status_code == 429
        busy.mode = ok.mode = "ok"
        time.sleep(1.1)
        assert c.post(r.url + "/v1/completions", json=BODY).status_code == 200


def test_a_large_answer_is_relayed_at_the_clients_pace(pair):
    big, _ = pair
    big.mode, big.big_bytes = "big", 256 * 2**20
    with router([big]) as r:
        base = rss_mb()
        s = socket.create_connection(("127.0.0.1", r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        time.sleep(1.5)  # the client reads nothing: the router must not buffer 256 MiB meanwhile
        held = rss_mb() - base
        got, head = 0, b""
        s.settimeout(10)
        while b"\r\n\r\n" not in head:
            head += s.recv(65536)
        got = len(head.split(b"\r\n\r\n", 1)[1])
        while got < big.big_bytes:
            chunk = s.recv(1 << 20)
            assert chunk
            got += len(chunk)
        s.close()
        assert b"content-length: %d" % big.big_bytes in head.lower()
        assert held < 40, f"{held:.0f} MB held while the client did not read"
        big.mode = "ok"
        assert httpx.post(r.url + "/v1/completions", json=BODY, timeout=10).status_code == 200
