"""The Batch API through `slopilot route` processes (the CLI, a state dir):

* the `openai` client end to end in front of `serve tiny` engines: a batch of completions and chat
  lines mixed with a few invalid ones, polled to `completed`; every valid line answered once in the
  output file, every invalid one in the error file with its reason (2,000 lines on one engine; on two
  engines under `slow`);
* durability: the router killed with SIGKILL at random points of a 10,000-line batch on emulated
  engines, restarted on the same state dir each time; the output file has every line exactly once.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest

from controlplane.prometheus_server import free_port
from tests.e2e.conftest import ROOT, EmulatedServer, wait_for, wait_healthy
from tests.e2e.test_router_openai import Engine

TERMINAL = ("completed", "failed", "expired", "cancelled")


class RouteProcess:
    """`slopilot route --endpoint URL... --state-dir DIR` on a fixed port; killable and restartable."""

    def __init__(self, urls: list[str], state_dir: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "slopilot.cli", "route", "--port", str(self.port), "--state-dir",
                    state_dir, *[a for u in urls for a in ("--endpoint", u)], *args]
        self.log = tempfile.TemporaryFile()
        self.proc: subprocess.Popen | None = None

    def start(self) -> RouteProcess:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

        def up() -> bool:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise AssertionError(f"route exited {self.proc.returncode}: {self.log.read()[-2000:]!r}")
            try:
                return httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200
            except httpx.TransportError:
                return False
        wait_for(up, 60, 0.1, "the router's /health")
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request_line(i: int, model: str, chat: bool, max_tokens: int) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": f"line {i}: tell me something"}]
    else:
        body["prompt"] = f"line {i}: once upon a time"
    return {"custom_id": f"line-{i}", "method": "POST",
            "url": "/v1/chat/completions" if chat else "/v1/completions", "body": body}


def submit(client: openai.OpenAI, rows: list) -> str:
    text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    fid = client.files.create(file=("batch.jsonl", io.BytesIO(text.encode())), purpose="batch").id
    return client.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h").id


def poll(client: openai.OpenAI, batch_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in TERMINAL:
            return b
        assert time.monotonic() < deadline, f"batch {b.status} after {timeout:g}s: {b.request_counts}"
        time.sleep(0.25)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if not file_id else [json.loads(s) for s in client.files.content(file_id).text.splitlines()]


INVALID = ["{\"custom_id\": \"broken\", ",  # not JSON
           {"method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": "x"}},  # no id
           {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {"model": "tiny"}},
           {"custom_id": "negative", "method": "POST", "url": "/v1/completions",  # the engine's 400
            "body": {"model": "tiny", "prompt": "x", "max_tokens": -1}},
           {"custom_id": "no-such-model", "method": "POST", "url": "/v1/completions",  # the router's 404
            "body": {"model": "nope", "prompt": "x", "max_tokens": 2}}]


def run_tiny_batch(n: int, tmp_path, engines: int) -> None:
    engines = [Engine("--model", "tiny", "--max-model-len", "512") for _ in range(engines)]
    router = None
    try:
        wait_healthy(engines, timeout=120)
        router = RouteProcess([e.url for e in engines], str(tmp_path / "state")).start()
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=2)
        rows: list = [request_line(i, "tiny", chat=i % 2 == 1, max_tokens=4) for i in range(n)]
        for k, bad in enumerate(INVALID):  # spread through the file
            rows.insert((k + 1) * n // (len(INVALID) + 1), bad)
        t0 = time.monotonic()
        b = poll(client, submit(client, rows), timeout=30 + n * 0.25)
        took = time.monotonic() - t0
        out, err = lines_of(client, b.output_file_id), lines_of(client, b.error_file_id)
        print(f"{n} valid lines + {len(INVALID)} invalid: {b.status} in {took:.1f}s "
              f"({n / took:.0f} lines/s), load average {os.getloadavg()[0]:.1f}")
        assert b.status == "completed"
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == \
            (n + len(INVALID), n, len(INVALID))
        ids = [o["custom_id"] for o in out]
        assert len(ids) == len(set(ids)) == n and set(ids) == {f"line-{i}" for i in range(n)}
        for o in out:
            body = o["response"]["body"]
            chat = int(o["custom_id"].split("-")[1]) % 2 == 1
            assert o["response"]["status_code"] == 200 and body["usage"]["completion_tokens"] == 4
            text = body["choices"][0]["message"]["content"] if chat else body["choices"][0]["text"]
            assert isinstance(text, str) and body["model"] == "tiny"
        reasons = {e["custom_id"]: e for e in err}  # the unreadable line and the one without an id: None
        assert len(err) == len(INVALID) and set(reasons) == {None, "wrong-url", "negative", "no-such-model"}
        assert reasons["wrong-url"]["error"]["code"] == "invalid_request"
        assert "url" in reasons["wrong-url"]["error"]["message"]
        assert reasons["negative"]["response"]["status_code"] == 400
        assert reasons["no-such-model"]["response"]["status_code"] == 404
        assert sorted(e.code for e in b.errors.data) == ["invalid_json_line", "invalid_request",
                                                          "missing_required_parameter"]
    finally:
        if router is not None:
            router.stop()
        for e in engines:
            e.stop()


def test_openai_2000_line_batch_through_route_on_a_tiny_engine(tmp_path):
    run_tiny_batch(2000, tmp_path, engines=1)


@pytest.mark.slow
def test_openai_2000_line_batch_through_route_on_two_tiny_engines(tmp_path):
    run_tiny_batch(2000, tmp_path, engines=2)


@pytest.mark.slow
def test_router_sigkilled_mid_batch_resumes_every_line_once(tmp_path):
    n, kills = 10_000, 6
    engines = [EmulatedServer("--max-num-seqs", "256") for _ in range(2)]
    router = None
    try:
        wait_healthy(engines)
        state = str(tmp_path / "state")
        router = RouteProcess([e.url for e in engines], state, "--batch-max-inflight", "128").start()
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=30)
        batch_id = submit(client, [request_line(i, "llama2-70b", i % 2 == 1, 2) for i in range(n)])
        rng = random.Random(7)
        # random points: the first while the batch is being read in, the others at random shares of
        # the lines answered, each a random fraction of a second after that share is reached
        targets = [0.0, *sorted(rng.uniform(0.02, 0.95) * n for _ in range(kills - 1))]
        t0 = time.monotonic()
        progress = []
        for target in targets:
            wait_for(lambda: client.batches.retrieve(batch_id).request_counts.completed >= target, 300, 0.05,
                     f"{target:.0f} lines answered")
            if target:
                time.sleep(rng.uniform(0, 0.3))
            progress.append(client.batches.retrieve(batch_id).request_counts.completed)
            router.kill()
            router.start()
        b = poll(client, batch_id, timeout=600)
        took = time.monotonic() - t0
        out, err = lines_of(client, b.output_file_id), lines_of(client, b.error_file_id)
        ids = [o["custom_id"] for o in out]
        print(f"{kills} SIGKILLs at {progress} answered lines; {b.status} in {took:.0f}s, "
              f"{len(ids)} output lines, {len(set(ids))} distinct, load average {os.getloadavg()[0]:.1f}")
        assert b.status == "completed" and err == []
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (n, n, 0)
        assert len(ids) == n and set(ids) == {f"line-{i}" for i in range(n)}  # every line, exactly once
        assert all(o["response"]["status_code"] == 200 for o in out)
    finally:
        if router is not None:
            router.stop()
        for e in engines:
            e.stop()
