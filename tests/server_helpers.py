"""Shared by the server tests: error-body checks, /metrics reads, waits, a `slopilot serve` process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    """r is an OpenAI-style error with this status (and param); returns its "error" object."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["code"] == status
    if param is not None:
        assert err["param"] == param, err
    return err


def metric(url: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def wait_for(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def idle(url: str) -> bool:
    """Nothing running or waiting, and every KV block free."""
    return (metric(url, "vllm:num_requests_running") == 0 and metric(url, "vllm:num_requests_waiting") == 0
            and metric(url, "vllm:kv_cache_usage_perc") == 0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(*args: str) -> tuple[subprocess.Popen, str]:
    """`slopilot serve ARGS --port P` until /health answers 200; (process, base url)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "slopilot.cli", "serve", *args, "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {proc.stdout.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("serve did not become healthy")


# a process of its own, so that the load the test generates never delays a probe
PROBE = """
import http.client, json, sys, threading, time
port, latencies, failures = int(sys.argv[1]), [], []
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
while not done.is_set():
    t0 = time.perf_counter()
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        latencies.append((t0, time.perf_counter() - t0))
        if r.status != 200:
            failures.append(r.status)
    except (OSError, http.client.HTTPException) as exc:
        failures.append(repr(exc))
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    done.wait(0.02)
print(json.dumps({"latencies": latencies, "failures": failures}))
"""


def start_probe(port: int) -> subprocess.Popen:
    """GET /health every 20 ms on one kept-alive connection until its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", PROBE, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def stop_probe(probe: subprocess.Popen) -> tuple[list[tuple[float, float]], list]:
    out, _ = probe.communicate("", timeout=30)
    result = json.loads(out)
    return result["latencies"], result["failures"]
