"""P/D with real engine processes (`slopilot serve MODEL --kv-transfer-config ...`, real weights) killed
with SIGKILL at the worst moments, the router in front where a client would have it:

- the producer killed mid-transfer: the client still gets its answer (the consumer computes the prompt
  itself, the same text) and never hangs; the consumer's landing blocks are freed and its /metrics KV
  usage returns to idle; the next long request is a clean 503 (no prefill endpoint left);
- the consumer killed mid-transfer: the client's connection ends (an error, not a hang); the
  producer's lease is never confirmed and its blocks are freed at the lease timeout, KV usage to idle;
- the consumer killed mid-decode: the client's stream ends at once with an error event and [DONE] (the
  router's); the producer's blocks were freed at the consumer's read, its KV usage is idle.

The producer paces its block payloads (kv_connector_extra_config.send_bandwidth_gbs) so a transfer
takes seconds on loopback and the kill lands inside it; the kill is sent once the consumer's landing
blocks show in its KV usage (the pull has begun) and the producer's lease is still held.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.pd import PDSettings
from controlplane.router.server import RouterServer
from routing.config import RouterConfig
from tests.engine.engine_helpers import save_random_llama
from tests.server_helpers import CMPL, free_port, metric, wait_for

pytestmark = pytest.mark.slow  # real engine processes (torch) started five times: about a minute

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = 256
PACE_GBS = 0.0001  # 100 kB/s: the 1,000-token prompt's 62 blocks (508 kB in this model) take about 5 s
IDS = [3 + (11 * i) % 380 for i in range(1000)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_random_llama(tmp_path_factory.mktemp("llama_pd_kill"), max_position_embeddings=4096))


class Engine:
    """A `slopilot serve` process with a KV-transfer role."""

    def __init__(self, model: str, role: str, lease_timeout_s: float = 60.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = {"lease_timeout_s": lease_timeout_s, "send_bandwidth_gbs": PACE_GBS}
        kv = {"kv_connector": "TcpConnector", "kv_role": role, "kv_connector_extra_config": extra}
        self.log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", model, "--port", str(self.port),
               "--served-model-name", "m", "--block-size", "16", "--num-kv-blocks", str(BLOCKS),
               "--kv-transfer-config", json.dumps(kv)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self, timeout: float = 120.0) -> Engine:
        def up() -> bool:
            assert self.proc.poll() is None, f"serve exited: {self.output()[-2000:]}"
            try:
                return httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_for(up, timeout=timeout), f"serve not healthy: {self.output()[-2000:]}"
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def kv(self) -> float:
        return metric(self.url, "vllm:kv_cache_usage_perc")


def body(ids, **extra) -> dict:
    return {"model": "m", "prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": True, **extra}


def in_thread(fn):
    """Runs fn() in a thread; returns a callable giving (result, exception, seconds) once done."""
    out: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc
        out["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout: float):
        t.join(timeout)
        assert not t.is_alive(), f"the client still waits after {timeout:g} s: a hang"
        return out.get("result"), out.get("error"), out["seconds"]

    return join


def started(engines: list[Engine]) -> list[Engine]:
    return [e.ready() for e in engines]  # started together, waited for in turn


def test_producer_killed_mid_transfer(model_dir):
    p, d = started([Engine(model_dir, "kv_producer"), Engine(model_dir, "kv_consumer")])
    r = RouterServer(build_router_app(RouterConfig(refresh_interval=0.05), static([d.url]),
                                      pd=PDSettings([p.url], threshold=64))).start()
    try:
        done = in_thread(lambda: httpx.post(r.url + CMPL, json=body(IDS), timeout=120, trust_env=False))
        assert wait_for(lambda: metric(p.url, "slopilot:kv_transfer_leased_blocks") > 0, timeout=60), done(1)
        # the pull has begun: the consumer holds landing blocks, the producer its lease
        assert wait_for(lambda: d.kv() > 0 and metric(p.url, "slopilot:kv_transfer_leased_blocks") > 0,
                        timeout=60)
        p.kill()
        t_kill = time.monotonic()
        got, error, _ = done(60)
        assert error is None and got.status_code == 200, (error, got and got.text)
        answered_after = time.monotonic() - t_kill
        text = got.json()["choices"][0]["text"]
        # the consumer computed the prompt itself: the same text as a plain request to it
        plain = httpx.post(d.url + CMPL, json=body(IDS), timeout=60, trust_env=False).json()
        assert text == plain["choices"][0]["text"]
        assert metric(d.url, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(d.url, "vllm:nixl_xfer_time_seconds_count") == 0  # no pull completed
        assert wait_for(lambda: d.kv() == 0.0, timeout=10)  # its landing blocks freed
        assert answered_after < 30, answered_after
        # the dead producer: the next long request is a clean 503, fast
        t0 = time.monotonic()
        again = httpx.post(r.url + CMPL, json=body(IDS[::-1]), timeout=30, trust_env=False)
        assert again.status_code == 503 and "no prefill endpoint" in again.json()["error"]["message"]
        assert time.monotonic() - t0 < 5
        assert d.kv() == 0.0
    finally:
        r.stop()
        for e in (p, d):
            e.stop()


def test_consumer_killed_mid_transfer_then_mid_decode(model_dir):
    p, d = started([Engine(model_dir, "kv_producer", lease_timeout_s=4.0), Engine(model_dir, "kv_consumer")])
    d2 = None
    try:
        prefill = body(IDS, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        first = httpx.post(p.url + CMPL, json=prefill, timeout=60, trust_env=False).json()
        kv = first["kv_transfer_params"]
        assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == len(kv["remote_block_ids"]) == 62
        done = in_thread(lambda: httpx.post(d.url + CMPL, json=body(IDS, kv_transfer_params=kv), timeout=120,
                                            trust_env=False))
        assert wait_for(lambda: d.kv() > 0, timeout=30)  # landing blocks taken: the pull is on
        d2 = Engine(model_dir, "kv_consumer")  # the next test's consumer starts meanwhile
        d.kill()
        _, error, seconds = done(30)
        assert isinstance(error, httpx.TransportError), error  # the connection ended: an error, no hang
        # never confirmed: the producer's lease ends at its timeout, its blocks freed
        assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == 62
        assert wait_for(lambda: p.kv() == 0.0, timeout=15)
        assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == 0
        assert metric(p.url, "vllm:nixl_num_kv_expired_reqs_total") == 1

        # a consumer killed mid-decode (through the router, streamed): the producer's blocks were freed
        # at the read, the client's stream ends
        d2.ready()
        r = RouterServer(build_router_app(RouterConfig(refresh_interval=0.05), static([d2.url]),
                                          pd=PDSettings([p.url], threshold=64))).start()
        try:
            ids = IDS[::-1]
            chunks: list[str] = []

            def stream():
                with httpx.stream("POST", r.url + CMPL, json=body(ids, max_tokens=3000, stream=True),
                                  timeout=120, trust_env=False) as s:
                    for line in s.iter_lines():
                        chunks.append(line)
                return s.status_code

            done = in_thread(stream)
            assert wait_for(lambda: len(chunks) >= 3, timeout=60)  # decoding: tokens streamed
            assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == 0  # read and confirmed
            assert metric(d2.url, "vllm:nixl_xfer_time_seconds_count") == 1
            d2.kill()
            status, error, _ = done(30)
            # the router ends the stream cleanly: an OpenAI-style error event, then [DONE]
            assert error is None and status == 200, error
            assert any("the endpoint failed mid-stream" in c for c in chunks), chunks[-3:]
            assert chunks[-2:] == ["data: [DONE]", ""] or chunks[-1] == "data: [DONE]", chunks[-3:]
            assert p.kv() == 0.0
        finally:
            r.stop()
    finally:
        for e in (p, d) + ((d2,) if d2 else ()):
            e.stop()
