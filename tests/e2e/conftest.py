"""Shared fixtures for multi-process tests: free ports, emulated engine servers, a real Prometheus.

    def test_x(emulated_servers, prometheus):
        urls = emulated_servers(2)                           # `slopilot serve --emulate` processes
        prom = prometheus(urls, scrape_interval=1.0)         # started, ready, scraping them
        ...                                                  # all stopped at teardown

SteadyLoad(urls, rate) sends completions at a constant rate. Every process started here is stopped
(SIGTERM, then SIGKILL) when the test ends, pass or fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from controlplane.prometheus_server import PrometheusServer, free_port
from engine.threads import child_env

ROOT = Path(__file__).resolve().parents[2]
EMULATED_MODEL = "h100-llama2-70b-tp4"


class EmulatedServer:
    """One `slopilot serve --emulate MODEL --port P` process."""

    def __init__(self, *args: str, model: str = EMULATED_MODEL):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--emulate", model, "--port", str(self.port),
               *args]
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on it
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited with {self.proc.returncode}: {self.output()[-2000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_healthy(servers: list[EmulatedServer], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.healthy()]
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} emulated server(s) not healthy after {timeout:g}s")
        time.sleep(0.1)


@pytest.fixture
def emulated_servers():
    """start(n, *serve_args) -> base URLs of n healthy emulated servers (started in parallel)."""
    started: list[EmulatedServer] = []

    def start(n: int = 1, *args: str, model: str = EMULATED_MODEL) -> list[str]:
        servers = [EmulatedServer(*args, model=model) for _ in range(n)]
        started.extend(servers)
        wait_healthy(servers)
        return [s.url for s in servers]

    start.servers = started  # the EmulatedServer objects, e.g. to stop one mid-test
    yield start
    for s in started:
        s.stop()


@pytest.fixture
def prometheus(tmp_path):
    """start(targets, scrape_interval=1.0, **PrometheusServer options) -> a ready PrometheusServer."""
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is not installed (Debian package: prometheus)")
    started: list[PrometheusServer] = []

    def start(targets=(), scrape_interval: float = 1.0, **options) -> PrometheusServer:
        options.setdefault("data_dir", tmp_path / f"prometheus-{len(started)}")
        server = PrometheusServer(list(targets), scrape_interval=scrape_interval, **options)
        started.append(server)
        return server.start()

    yield start
    for s in started:
        s.cleanup()


class SteadyLoad:
    """Completions at a constant rate, round-robin over `urls`, from a thread (requests from a pool).

    with SteadyLoad(urls, rate=16, prompt="hi " * 30, max_tokens=12): ...   # stops and waits on exit

    `body` (a callable) gives each request's body instead; `poisson_seed` makes the gaps exponential
    (Poisson arrivals at the same mean rate).
    """

    def __init__(self, urls: list[str], rate: float, prompt: str = "hello " * 32, max_tokens: int = 12,
                 duration: float | None = None, body=None, poisson_seed: int | None = None):
        self.urls, self.rate, self.duration = list(urls), rate, duration
        fixed = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        self.body = body or (lambda: fixed)
        self.rng = None if poisson_seed is None else np.random.default_rng(poisson_seed)
        self.sent = self.ok = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=60, trust_env=False)
        self._pool = ThreadPoolExecutor(max_workers=64)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, url: str, body: dict) -> None:
        try:
            r = self._client.post(url + "/v1/completions", json=body)
            if r.status_code == 200:
                self.ok += 1
            else:
                self.errors.append(f"{r.status_code} {r.text[:200]}")
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))

    def _run(self) -> None:
        start, gaps = time.monotonic(), 0.0
        while not self._stop.is_set():
            due = start + (self.sent / self.rate if self.rng is None else gaps)
            if self.duration is not None and due - start >= self.duration:
                break
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            urls = self.urls  # may be replaced while running (an engine gone)
            if urls:
                # the body is drawn here, in one thread (a callable body may hold an rng)
                self._pool.submit(self._one, urls[self.sent % len(urls)], self.body())
            self.sent += 1
            if self.rng is not None:
                gaps += self.rng.exponential(1 / self.rate)

    def start(self) -> SteadyLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> SteadyLoad:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_pki(d: Path) -> Path:
    """A CA (ca.pem), a server certificate for 127.0.0.1 (server.pem/.key) and a client certificate
    (client.pem/.key) in `d`, made with the openssl command."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=test-ca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", *(["-extfile", "san.cnf"] if name == "server" else []))
    return d


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def wait_for(check, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll `check()` until it returns a truthy value; that value, or AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g}s")
        time.sleep(interval)


# -- a real vLLM (CPU build) serving the random-weight Llama; `make vllm` builds both -------------------
VLLM_VENV = ROOT / ".venv-vllm"
VLLM_MODEL_DIR = ROOT / "build" / "random-llama"
VLLM_MODEL = "random-llama"
# scheduling settings given to vLLM (its /metrics does not show them) and to the calibration
VLLM_SETTINGS = {"max_num_seqs": 64, "max_num_batched_tokens": 2048}
VLLM_START_TIMEOUT = 420.0  # about 40 s on an idle machine; several minutes on a busy 2-core one


class VllmServer:
    """`vllm serve build/random-llama` from .venv-vllm on a free port, in its own process group."""

    def __init__(self, *extra_args: str, log_name: str = "vllm-serve.log", cpu: int | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cache = ROOT / "build" / "vllm-cache"
        # vLLM with its own OpenMP settings, not the wait policy importing engine set here
        env = child_env({k: v for k, v in os.environ.items()
                         if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")})
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CACHE_ROOT=str(cache / "vllm"),
                   TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), VLLM_CPU_KVCACHE_SPACE="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
                   # above httpx's 5 s pool expiry: at equal 5 s a reused idle connection can meet the
                   # server's close, and the POST fails with ReadError
                   VLLM_HTTP_TIMEOUT_KEEP_ALIVE="60")
        if cpu is not None:  # the whole server (front end, engine core, worker) on one core
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
        cmd = [str(VLLM_VENV / "bin" / "vllm"), "serve", str(VLLM_MODEL_DIR), "--host", "127.0.0.1",
               "--port", str(self.port), "--dtype", "float32", "--max-model-len", "2048",
               "--max-num-seqs", str(VLLM_SETTINGS["max_num_seqs"]),
               "--max-num-batched-tokens", str(VLLM_SETTINGS["max_num_batched_tokens"]),
               # the second name lets the fidelity driver shared with the tiny-server test address it
               "--served-model-name", VLLM_MODEL, "tiny", *extra_args]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        self.log = open(ROOT / "build" / log_name, "w+b")  # kept after the session, to read
        # its own process group (its engine and worker processes are stopped with it), but not its own
        # session: Linux shares the CPU fairly between sessions (autogroups), so a server in a session
        # of its own, whose engine core spins on the shared core while the worker steps, starves the
        # client in ours of that core for 100-250 ms at a time, and the client's TTFT tail measures that
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     process_group=0)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout: float = VLLM_START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited ({self.proc.returncode}): {self.output()[-3000:]}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"vllm serve not ready after {timeout:g}s: {self.output()[-3000:]}")
            time.sleep(1.0)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # any engine or worker process left behind
        except ProcessLookupError:
            pass
        self.proc.wait()


def skip_without_vllm() -> None:
    if not (VLLM_VENV / ".installed").exists():  # written last by `make vllm`: a failed build skips
        pytest.skip(f"{VLLM_VENV.name} does not exist or is incomplete (`make vllm` builds it)")
    if not (VLLM_MODEL_DIR / "config.json").exists():
        pytest.skip(f"no model in {VLLM_MODEL_DIR} (`make vllm` writes it)")


@pytest.fixture(scope="session")
def vllm_server():
    """One ready VllmServer for the session (about 3 GB of memory: one at a time), stopped at the end."""
    skip_without_vllm()
    server = VllmServer()
    try:
        server.wait_ready()
        yield server
        if server.proc.poll() is not None:
            raise AssertionError(f"vllm serve exited during the session: {server.output()[-3000:]}")
    finally:
        server.stop()
        server.log.close()
