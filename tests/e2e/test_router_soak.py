"""Issue 35's soak (must-show 2; slow, about two minutes): the router in front of two fake engines and
a hung one, under good streaming clients mixed with slowloris clients, clients leaving before their
first byte and mid-stream, and one engine's /metrics flapping between numbers and +-Inf/NaN/1e999.
Afterwards nothing is in flight, no descriptor is left over, the process's RSS is within 50 MB of
the start, and the good clients' p99 TTFT is within 2x of a clean run (with a 20 ms floor: the clean
p99 is a few ms, and a few ms of scheduling noise on a loaded 2-core machine would decide it)."""

from __future__ import annotations

import gc
import os
import random
import socket
import threading
import time

import numpy as np
import pytest

from controlplane.router.app import build_router_app
from controlplane.router.config import RouterConfig
from controlplane.router.discovery import static
from controlplane.router.limits import ServerLimits
from controlplane.router.server import RouterServer
from tests.fake_engine import FakeEngine

pytestmark = pytest.mark.slow
CHAOS_SECONDS = 60
BODY = b'{"model": "m", "prompt": "hello", "stream": true}'
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def good_request(port: int) -> float:
    """One streamed request to its end; the seconds to its first body byte."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        t0 = time.perf_counter()
        s.sendall(REQUEST)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        while not rest:
            rest += s.recv(65536)
        ttft = time.perf_counter() - t0
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk, "the stream broke off"
            rest += chunk
        assert b"data: [DONE]" in rest
        return ttft


def good_clients(port: int, seconds: float, out: list, stop: threading.Event) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        out.append(good_request(port))
        time.sleep(0.02)


def slowloris(port: int, stop: threading.Event, n: int = 150) -> None:
    conns: list[socket.socket] = []
    while not stop.is_set():
        while len(conns) < n:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
            conns.append(s)
        for s in list(conns):
            try:
                s.sendall(b"x: y\r\n")
            except OSError:  # timed out by the router: replaced by a new one
                conns.remove(s)
                s.close()
        stop.wait(0.5)
    for s in conns:
        s.close()


def leavers(port: int, stop: threading.Event) -> None:
    rnd = random.Random(0)
    while not stop.is_set():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(REQUEST)
        if rnd.random() < 0.5:
            s.recv(200)  # mid-stream: after the first bytes
        s.close()  # else before its first byte
        stop.wait(0.02)


def flapper(engine: FakeEngine, stop: threading.Event) -> None:
    values = ["3", "+Inf", "0", "-Inf", "NaN", "1e999", "2"]
    i = 0
    while not stop.is_set():
        engine.waiting = values[i % len(values)]
        i += 1
        stop.wait(0.05)


def test_soak():
    a, b, hung = (FakeEngine(chunks=5, chunk_delay=0.01).start() for _ in range(3))
    cfg = RouterConfig(refresh_interval=0.1, first_byte_timeout=1.0, scrape_timeout=0.5)
    limits = ServerLimits(header_timeout=2.0, body_timeout=2.0, idle_timeout=5.0)
    try:
        clean_router = RouterServer(build_router_app(cfg, static([a.url, b.url])), limits=limits).start()
        clean: list[float] = []
        good_clients(clean_router.port, 20, clean, threading.Event())
        clean_router.stop()

        hung.mode = "hang_all"
        router = RouterServer(build_router_app(cfg, static([a.url, b.url, hung.url])), limits=limits).start()
        for _ in range(20):  # warm up: the hung engine found out (its scrape times out), pools filled
            good_request(router.port)
        gc.collect()
        fds0, rss0 = fds(), rss_mb()
        stop = threading.Event()
        chaos = [threading.Thread(target=f, args=args, daemon=True) for f, args in
                 [(slowloris, (router.port, stop)), (leavers, (router.port, stop)), (flapper, (a, stop))]]
        for t in chaos:
            t.start()
        soaked: list[float] = []
        good_clients(router.port, CHAOS_SECONDS, soaked, stop)
        stop.set()
        for t in chaos:
            t.join(10)
        a.waiting = "0"
        time.sleep(limits.header_timeout + 1.5)  # the router's sweep closes what the clients left
        pool = router.state.pool
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (any(e.outstanding for e in pool.endpoints.values())
                                               or a.active or b.active or fds() > fds0 + 8):
            time.sleep(0.2)
        gc.collect()
        p99_clean, p99_soak = np.percentile(clean, 99), np.percentile(soaked, 99)
        print(f"\nsoak: {len(soaked)} good requests under chaos, {len(clean)} clean; p99 TTFT "
              f"{p99_soak * 1e3:.1f} ms vs {p99_clean * 1e3:.1f} ms clean; fds {fds0} -> {fds()}; "
              f"RSS {rss0:.0f} -> {rss_mb():.0f} MB; aborted by leavers {a.aborted + b.aborted}; "
              f"load {os.getloadavg()[0]:.1f}")
        assert all(e.outstanding == 0 for e in pool.endpoints.values()) and a.active == b.active == 0
        assert fds() <= fds0 + 8
        assert rss_mb() - rss0 < 50
        assert pool.loop_restarts == 0 and len(pool.routable()) == 2  # the hung one stays out
        assert p99_soak <= 2 * max(p99_clean, 0.02)
        router.stop()
    finally:
        for e in (a, b, hung):
            e.stop()
