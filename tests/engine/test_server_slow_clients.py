"""Issue findings 4 and 3 (the engine server's side): connections sending a body one byte every few
seconds took the in-flight cap, so every good request got 429 while /health said 200; a huge header
stalled the event loop. Now a body being uploaded does not count toward the in-flight cap (uploads
have their own larger cap), a body must arrive within --body-timeout (408), and the head within 10 s
and 72 KiB (408 / 431): good requests are served throughout."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from engine.args import EngineArgs
from engine.server import BackgroundServer, build_engine, build_server, guard
from simulator.latency import load_latency_model
from tests.server_helpers import CMPL


@pytest.fixture(scope="module")
def server():
    engine, name = build_engine(EngineArgs(max_model_len=512, max_num_seqs=4), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name, max_waiting=4, body_timeout=1.5)) as s:
        s.model = name
        yield s


def slow_upload(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: 100\r\n\r\n{")
    return s


def test_slow_uploads_do_not_take_the_places_of_served_requests(server):
    slow = [slow_upload(server.port) for _ in range(20)]  # the in-flight cap is 4 + 4 = 8
    time.sleep(0.3)
    with httpx.Client(timeout=10) as c:
        body = {"prompt": "hi", "max_tokens": 2}
        codes = [c.post(server.url + CMPL, json=body).status_code for _ in range(10)]
        assert codes == [200] * 10
        assert c.get(server.url + "/health").status_code == 200
    time.sleep(1.6)  # past the body timeout: each slow upload got a 408 and its connection closed
    for s in slow:
        s.settimeout(3)
        answer = b""
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert b"RequestTimeoutError" in answer
        s.close()


def test_a_huge_header_gets_431_and_a_silent_client_408(server, monkeypatch):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
        sent = 0
        t0 = time.monotonic()
        try:
            while sent < 50 * 2**20:
                s.sendall(b"b" * 2**20)
                sent += 2**20
        except OSError:
            pass
        s.settimeout(5)
        try:
            answer = s.recv(4096)
        except ConnectionResetError:
            answer = b"(reset)"
    assert answer.startswith(b"HTTP/1.1 431") or answer == b"(reset)", answer[:80]
    assert sent < 20 * 2**20 and time.monotonic() - t0 < 5  # refused early, not after 50 MB
    assert httpx.get(server.url + "/health", timeout=2).status_code == 200
    monkeypatch.setattr(guard, "HEADER_TIMEOUT", 0.5)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")  # and nothing more
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
