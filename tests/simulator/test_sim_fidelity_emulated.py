"""Fidelity against a fleet of emulated servers: three `slopilot serve --emulate` processes (real
HTTP, real scheduler and KV block manager, each step sleeping what the H100 Llama-2-70B latency model
predicts) serve a Poisson workload that the test sends in wall time, round-robin, with streaming;
the simulator, given the same arrivals, lengths, engine settings, latency model and round-robin
router, must match the client-side median TTFT, TPOT and E2E within 10% and the p90 within 15%.

The HTTP path (the client's send, the server's parsing and hand-off to its engine thread, the first
SSE chunk back) is what the simulator does not step: it is measured first, on requests sent one at a
time to an idle server (client TTFT less the latency model's prefill step), and given to the
simulator as the router's latency_ms.
"""

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "h100-llama2-70b-tp4"
REPLICAS = 3
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "kv_blocks": 4096, "max_model_len": 4096}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_fleet(n: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = _free_port()
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--emulate", MODEL, "--port", str(port),
               "--max-num-seqs", str(ENGINE["max_num_seqs"]),
               "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
               "--num-kv-blocks", str(ENGINE["kv_blocks"]), "--max-model-len", str(ENGINE["max_model_len"]),
               "--no-prefix-caching"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    pending = set(urls)
    while pending:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"serve exited early: {p.stderr.read().decode()[-2000:]}")
        for u in list(pending):
            try:
                if httpx.get(u + "/health", timeout=2).status_code == 200:
                    pending.discard(u)
            except httpx.TransportError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} emulated servers did not become healthy")
        time.sleep(0.2)
    return procs, urls


def _http_overhead_ms(url: str, requests: int = 12) -> float:
    """Median client TTFT less the model's prefill step, for single requests to an idle server."""
    from simulator.latency import load_latency_model

    model = load_latency_model(MODEL)
    extra = []
    with httpx.Client(timeout=60) as client:
        for i in range(requests):
            body = {"prompt": "b" * (200 + 50 * i), "max_tokens": 1, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            sent, first, prompt_tokens = time.perf_counter(), None, 0
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                        first = time.perf_counter()
                    if chunk.get("usage"):
                        prompt_tokens = chunk["usage"]["prompt_tokens"]
            step_ms = model.step_ms(prompt_tokens, prompt_tokens, 0, 0)
            extra.append((first - sent) * 1000 - step_ms)
            time.sleep(0.05)
    return max(0.0, float(np.median(extra)))


def _workload(n: int, rate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals -= arrivals[0]
    prompt_chars = rng.integers(100, 900, n)
    output = rng.integers(16, 97, n)
    return arrivals, prompt_chars, output


async def _drive(urls: list[str], arrivals, prompt_chars, output) -> dict:
    """Sends request i at arrivals[i] to urls[i % len(urls)]; client-side times and prompt tokens."""
    n = len(arrivals)
    sent, first, last = np.zeros(n), np.zeros(n), np.zeros(n)
    prompt_tokens, tokens = np.zeros(n, dtype=int), np.zeros(n, dtype=int)

    async def one(client: httpx.AsyncClient, i: int, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        body = {"prompt": "a" * int(prompt_chars[i]), "max_tokens": int(output[i]), "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        sent[i] = time.perf_counter() - t0
        async with client.stream("POST", urls[i % len(urls)] + "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter() - t0
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    prompt_tokens[i] = chunk["usage"]["prompt_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if tokens[i] == 0:
                        first[i] = now
                    tokens[i] += 1
                    last[i] = now

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        t0 = time.perf_counter() + 0.5
        await asyncio.gather(*(one(client, i, t0) for i in range(n)))
    assert (tokens == output).all(), "every request streams all its tokens"
    ttft, e2e = first - sent, last - sent
    return {"sent": sent, "prompt_tokens": prompt_tokens, "ttft": ttft, "e2e": e2e,
            "tpot": (e2e - ttft) / np.maximum(output - 1, 1)}


def _simulate(sent, prompt_tokens, output, http_ms: float) -> dict:
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    sc = load_scenario({
        "seed": 0,
        "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
        "router": {"policy": "round_robin", "latency_ms": http_ms},
        "pools": [{"name": "emu", "latency_model": MODEL, "replicas": REPLICAS, "prefix_caching": False,
                   "max_num_seqs": ENGINE["max_num_seqs"],
                   "max_num_batched_tokens": ENGINE["max_num_batched_tokens"],
                   "kv_blocks": ENGINE["kv_blocks"], "max_model_len": ENGINE["max_model_len"]}],
    })
    wl = Workload(sent - sent[0], prompt_tokens.copy(), output.copy())
    f = simulate(sc, workload=wl, plots=False).fleet
    ttft = (f.requests.first_token - f.arrival_ps) / 1e12
    e2e = (f.requests.finish - f.arrival_ps) / 1e12
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / np.maximum(f.requests.generated - 1, 1)}


def _compare(n: int, rate: float, p50_tol: float, p90_tol: float, record: str | None = None) -> None:
    arrivals, prompt_chars, output = _workload(n, rate)
    procs, urls = _start_fleet(REPLICAS)
    try:
        http_ms = _http_overhead_ms(urls[0])
        real = asyncio.run(_drive(urls, arrivals, prompt_chars, output))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    sim = _simulate(real["sent"], real["prompt_tokens"], output, http_ms)
    print(f"HTTP path: {http_ms:.2f} ms")
    report = {}
    for k in ("ttft", "tpot", "e2e"):
        for q in (50, 90):
            r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
            report[f"{k} p{q}"] = (r, s, s / r - 1)
    print("\n".join(f"{k}: emulated fleet {r * 1000:.1f} ms, sim {s * 1000:.1f} ms ({100 * e:+.1f}%)"
                    for k, (r, s, e) in report.items()))
    if record:  # docs/benchmarks/sim_fidelity.md's table, when asked for (bench/pages.py)
        from bench.pages import record_from_test

        record_from_test(record, ["measure", "emulated fleet", "simulator", "sim / fleet - 1", "bar"],
                         [[k.upper(), f"{r * 1000:.1f} ms", f"{s * 1000:.1f} ms", f"{100 * e:+.1f}%",
                           f"{100 * (p50_tol if k.endswith('p50') else p90_tol):.0f}%"]
                          for k, (r, s, e) in report.items()],
                         [f"{REPLICAS} `slopilot serve --emulate {MODEL}` processes, {n} Poisson requests at "
                          f"{rate:g}/s sent round-robin with streaming, against the simulator given the same "
                          f"arrivals and lengths; HTTP path measured first: {http_ms:.2f} ms."])
    for k, (r, s, e) in report.items():
        assert abs(e) <= (p50_tol if k.endswith("p50") else p90_tol), (k, report)


@pytest.mark.slow
def test_fidelity_emulated_fleet_600_requests():
    _compare(600, rate=12.0, p50_tol=0.10, p90_tol=0.15, record="sim_fidelity_emulated.json")


def test_fidelity_emulated_fleet_short():
    _compare(200, rate=12.0, p50_tol=0.10, p90_tol=0.15)
