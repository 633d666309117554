"""Issue 35's soak (must-show 2; slow, about two minutes): the router (`slopilot route`, a process of
its own) in front of two fake engines and a hung one, under good streaming clients mixed with slowloris
clients, clients leaving before their first byte and mid-stream, and one engine's /metrics flapping
between numbers and +-Inf/NaN/1e999. Afterwards nothing is in flight, no descriptor is left over, the
router's RSS is within 50 MB of the start, and the good clients' p99 TTFT is within 2x of a clean
run's: a second router in front of the same two engines without the bad clients, in periods
alternating with the chaos ones, so that both see the same machine.

Every party runs in a process of its own, as on separate machines: with the router, the engines and
the bad clients as threads of the test's process, their Python took the GIL from one another and the
p99 measured the test's own threads (2.0-3.6x clean that way, at load 2-9). Measured this way on
2026-12-04: 1.60x on a quiet machine (p99 2.3 vs 1.5 ms, load 0.3; router CPU 3% clean, 6% under
chaos); 1.32x and 3.96x at load 9-10 with other jobs on the 2 cores (scheduling noise)."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fake_engine import FakeEngine

pytestmark = pytest.mark.slow
ROUNDS, CLEAN_SECONDS, CHAOS_SECONDS = 3, 10, 20  # 60 s of chaos in all, 30 s clean
BODY = b'{"model": "m", "prompt": "hello", "stream": true}'
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))


ROOT = Path(__file__).resolve().parents[2]
INFLIGHT = "llm_d_epp_inflight_requests"
ROUTER_YAML = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
dataLayer: {refreshInterval: 100ms, scrapeTimeout: 500ms}
timeouts: {firstByte: 1s}
"""


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_router(config: Path, urls: list[str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [sys.executable, "-m", "slopilot.cli", "route", "-c", str(config), "--port", str(port),
            "--header-timeout", "2", "--body-timeout", "2", "--idle-timeout", "5", "--log-level", "error"]
    for u in urls:
        argv += ["--endpoint", u]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False).status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("slopilot route did not start")


def router_metric(port: int, name: str) -> dict[str, float]:
    """labels text -> value of one metric on the router's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out


def engines(conn, n: int) -> None:
    """The fake engines' process: starts n, sends their URLs, then answers commands until 'stop'."""
    es = [FakeEngine(chunks=5, chunk_delay=0.01).start() for _ in range(n)]
    conn.send([e.url for e in es])
    flap = threading.Event()
    threading.Thread(target=flapper, args=(es[0], flap), daemon=True).start()
    while True:
        cmd, *args = conn.recv()
        if cmd == "set":
            setattr(es[args[0]], args[1], args[2])
        elif cmd == "flap":
            flap.set() if args[0] else flap.clear()
        elif cmd == "get":
            conn.send([getattr(e, args[0]) for e in es])
            continue
        elif cmd == "stop":
            for e in es:
                e.stop()
            conn.send("ok")
            return
        conn.send("ok")


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


def flapper(engine: FakeEngine, on: threading.Event) -> None:
    values = ["3", "+Inf", "0", "-Inf", "NaN", "1e999", "2"]
    i = 0
    while True:
        on.wait()
        engine.waiting = values[i % len(values)]
        i += 1
        time.sleep(0.05)
        if not on.is_set():
            engine.waiting = "0"


def test_soak(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    eng = ctx.Process(target=engines, args=(theirs, 3), daemon=True)
    eng.start()

    def ask(*cmd):
        ours.send(cmd)
        return ours.recv()

    a, b, hung = ours.recv()
    (tmp_path / "router.yaml").write_text(ROUTER_YAML)
    ask("set", 2, "mode", "hang_all")
    clean_proc, clean_port = start_router(tmp_path / "router.yaml", [a, b])
    proc, port = start_router(tmp_path / "router.yaml", [a, b, hung])
    try:
        for _ in range(20):  # warm up: the hung engine found out (its scrape times out), pools filled
            good_request(port)
            good_request(clean_port)
        fds0, rss0 = fds(proc.pid), rss_mb(proc.pid)
        clean: list[float] = []
        soaked: list[float] = []
        busy = {"clean": 0.0, "chaos": 0.0}  # the routers' CPU seconds in their periods
        for _ in range(ROUNDS):
            c0 = cpu_seconds(clean_proc.pid)
            good_clients(clean_port, CLEAN_SECONDS, clean, threading.Event())
            busy["clean"] += cpu_seconds(clean_proc.pid) - c0
            stop = ctx.Event()
            chaos = [ctx.Process(target=f, args=(port, stop), daemon=True) for f in (slowloris, leavers)]
            for t in chaos:
                t.start()
            ask("flap", True)
            time.sleep(2)  # the chaos under way (the processes import) before the good clients start
            c0 = cpu_seconds(proc.pid)
            good_clients(port, CHAOS_SECONDS, soaked, threading.Event())
            busy["chaos"] += cpu_seconds(proc.pid) - c0
            stop.set()
            ask("flap", False)
            for t in chaos:
                t.join(10)
        time.sleep(2 + 1.5)  # the router's sweep closes what the clients left (header timeout 2 s)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (any(router_metric(port, INFLIGHT).values())
                                               or any(ask("get", "active")[:2]) or fds(proc.pid) > fds0 + 8):
            time.sleep(0.2)
        p99_clean, p99_soak = np.percentile(clean, 99), np.percentile(soaked, 99)
        aborted = sum(ask("get", "aborted")[:2])
        print(f"\nsoak: {len(soaked)} good requests under chaos, {len(clean)} clean; p99 TTFT "
              f"{p99_soak * 1e3:.1f} ms vs {p99_clean * 1e3:.1f} ms clean ({p99_soak / p99_clean:.2f}x); "
              f"router fds {fds0} -> {fds(proc.pid)}; RSS {rss0:.0f} -> {rss_mb(proc.pid):.0f} MB; "
              f"aborted by leavers {aborted}; "
              f"router CPU {busy['clean'] / (ROUNDS * CLEAN_SECONDS):.0%} clean, "
              f"{busy['chaos'] / (ROUNDS * CHAOS_SECONDS):.0%} under chaos; load {os.getloadavg()[0]:.1f}")
        assert not any(router_metric(port, INFLIGHT).values())
        assert ask("get", "active")[:2] == [0, 0]
        assert fds(proc.pid) <= fds0 + 8
        assert rss_mb(proc.pid) - rss0 < 50
        assert not any(router_metric(port, "slopilot_router_loop_restarts_total").values())
        assert sum(router_metric(port, "llm_d_epp_ready_endpoints").values()) == 2  # the hung one stays out
        assert aborted > 100  # the leavers did leave mid-stream, and the engines saw it
        assert p99_soak <= 2 * p99_clean
    finally:
        for p in (proc, clean_proc):
            p.kill()
            p.wait(10)
        ask("stop")
        eng.join(10)
