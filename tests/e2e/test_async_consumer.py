"""`slopilot async` with a real redis-server (Debian package `redis-server`): requests from a stream
sent through the router's batch band, results to the stream or key each names, acknowledged with the
result; killed with SIGKILL mid-way and restarted, every request answered exactly once."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import redis

from controlplane.prometheus_server import free_port
from tests.e2e.conftest import ROOT, wait_for
from tests.e2e.test_router_openai import start_router

MODEL = "llama2-70b"


class RedisServer:
    """redis-server on a free loopback port, nothing written outside `folder`."""

    def __init__(self, folder):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port, decode_responses=True)

        def up() -> bool:
            try:
                return self.client.ping()
            except redis.ConnectionError:
                return False
        wait_for(up, 10, 0.05, "redis-server answering PING")

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package: redis-server)")
    server = RedisServer(tmp_path)
    yield server
    server.stop()


class Consumer:
    def __init__(self, redis_url: str, router_url: str, *args: str):
        self.cmd = [sys.executable, "-m", "slopilot.cli", "async", "--redis", redis_url,
                    "--stream", "requests", "--router", router_url, "--consumer", "worker-1", *args]
        self.log = tempfile.TemporaryFile()
        self.proc = None

    def start(self) -> Consumer:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def enqueue(r: redis.Redis, n: int, max_tokens: int = 2) -> None:
    pipe = r.pipeline()
    for i in range(n):
        chat = i % 2 == 1
        body = {"model": MODEL, "max_tokens": max_tokens}
        body.update({"messages": [{"role": "user", "content": f"q{i}"}]} if chat else {"prompt": f"p{i}"})
        pipe.xadd("requests", {"id": f"r{i}", "url": "/v1/chat/completions" if chat else "/v1/completions",
                               "body": json.dumps(body), "reply_to": "results"})
    pipe.execute()


def results(r: redis.Redis) -> list[tuple[str, dict]]:
    return [(f["id"], json.loads(f["result"])) for _, f in r.xrange("results")]


def test_requests_from_a_stream_through_the_batch_band(emulated_servers, redis_server):
    urls = emulated_servers(1)
    r = redis_server.client
    with start_router(urls) as router:
        consumer = Consumer(redis_server.url, router.url).start()
        try:
            enqueue(r, 100)
            bad = [{"id": "no-reply", "body": "{}"},  # answered nowhere: acknowledged, no result
                   {"id": "bad-url", "url": "/v1/embeddings", "body": "{}", "reply_to": "results"},
                   {"id": "bad-body", "body": "[1,", "reply_to": "results"},
                   {"id": "late", "body": json.dumps({"model": MODEL, "prompt": "x"}), "deadline": "1",
                    "reply_to": "results"},
                   {"id": "keyed", "body": json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 3}),
                    "reply_key": "result:keyed"}]
            for fields in bad:
                r.xadd("requests", fields)
            wait_for(lambda: r.xlen("results") >= 103 and r.exists("result:keyed"), 60, 0.1,
                     "every request answered")
            got = dict(results(r))
            assert len(got) == 103 and all(got[f"r{i}"]["response"]["status_code"] == 200 for i in range(100))
            assert got["r1"]["response"]["body"]["object"] == "chat.completion"
            assert got["bad-url"]["error"]["code"] == "invalid_request"
            assert got["bad-body"]["error"]["code"] == "invalid_request"
            assert got["late"]["error"]["code"] == "deadline_exceeded"
            keyed = json.loads(r.get("result:keyed"))
            assert keyed["response"]["body"]["usage"]["completion_tokens"] == 3 and r.ttl("result:keyed") > 0
            wait_for(lambda: r.xpending("requests", "slopilot")["pending"] == 0, 10, 0.1, "all acknowledged")
            text = router.state.metrics.registry.get_sample_value(
                "llm_d_epp_request_total", {"model_name": MODEL, "priority": "0"})
            assert text == 101  # the 100 and the keyed one went through the router's gate
        finally:
            consumer.stop()
        assert "Traceback" not in consumer.output() and consumer.proc.returncode == 0


@pytest.mark.slow
def test_consumer_sigkilled_mid_stream_answers_every_request_once(emulated_servers, redis_server):
    n, kills = 3000, 6
    urls = emulated_servers(2, "--max-num-seqs", "256")
    r = redis_server.client
    with start_router(urls) as router:
        consumer = Consumer(redis_server.url, router.url, "--max-inflight", "64").start()
        try:
            enqueue(r, n)
            rng = random.Random(11)
            marks = sorted(rng.uniform(0.02, 0.9) * n for _ in range(kills))
            t0 = time.monotonic()
            at, pending = [], []
            for mark in marks:
                wait_for(lambda: r.xlen("results") >= mark, 120, 0.02, f"{mark:.0f} results")
                time.sleep(rng.uniform(0, 0.2))
                at.append(r.xlen("results"))
                consumer.kill()
                pending.append(r.xpending("requests", "slopilot")["pending"])  # delivered, not answered
                consumer.start()
            wait_for(lambda: r.xlen("results") >= n and r.xpending("requests", "slopilot")["pending"] == 0,
                     300, 0.2, "every request answered and acknowledged")
            time.sleep(1.0)  # nothing more arrives
            ids = [i for i, _ in results(r)]
            print(f"{kills} SIGKILLs at {at} results, {pending} requests pending; {len(ids)} results, "
                  f"{len(set(ids))} distinct in {time.monotonic() - t0:.0f}s, "
                  f"load average {os.getloadavg()[0]:.1f}")
            assert sum(pending) > 0  # the kills left requests delivered and unanswered
            assert len(ids) == len(set(ids)) == n  # every request once: the result and its ack are one step
            assert all(res["response"]["status_code"] == 200 for _, res in results(r))
        finally:
            consumer.stop()
