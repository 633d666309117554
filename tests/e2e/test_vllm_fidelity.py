"""Fidelity against a real vLLM: `slopilot calibrate --from-server` probes the live server from the
outside, then a Poisson workload of streamed requests is sent (arrival times and lengths recorded by
the client), and the simulator, given the same arrivals and lengths, the calibrated model, the pool's
settings and front end from that model (each request's delay drawn from the probe's idle requests),
predicts TTFT, TPOT and E2E.
The bar: medians within 10%, p90 within 15% (median error over three pairs in the slow test, one pair
here). The pipeline is checked hard (the calibration runs, reads vLLM's settings, the workload's
tokens all arrive); a miss of the bar is reported as xfail with the measured errors, which
docs/benchmarks.md records. Beside the client's percentiles each pair prints vLLM's own means (its
/metrics histograms) and how late the client's event loop woke. That lateness once carried the TTFT
tail: with the server in a session of its own, Linux's fair share between sessions (autogroups) let
vLLM's engine core, which spins on the shared core while its worker steps, hold the client off that
core for 100-250 ms at a time, and the client's TTFT p90 moved between 17 and 130 ms from run to run.
The server now starts in the test's session (conftest.VllmServer); the client wakes at most a few
milliseconds late, and its TTFT is the server's plus about 2.5 ms of HTTP path."""

import asyncio
import json
import os
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.latency.model import LatencyModel
from tests.e2e.conftest import VLLM_MODEL, VLLM_SETTINGS

pytestmark = pytest.mark.vllm

RATE = 8.0
BUDGET = 60.0
P50_TOL, P90_TOL = 0.10, 0.15


def workload(n: int, seed: int):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / RATE, n))
    return arrivals - arrivals[0], rng.integers(64, 193, n), rng.integers(16, 49, n)


SERVER_SIDE = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:inter_token_latency_seconds",
               "e2e": "vllm:e2e_request_latency_seconds"}
SUMS = {name + part for name in SERVER_SIDE.values() for part in ("_sum", "_count")}


def server_sums(url: str) -> dict[str, float]:
    """Sum and count of vLLM's own latency histograms (its clock: from the request's arrival at the
    front end to the engine's outputs, without the client's side of the HTTP path)."""
    page = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in SUMS:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def drive(url: str, arrivals, prompt, output, seed: int) -> dict:
    """Streamed requests at the given offsets; per request: sent, prompt tokens, TTFT, E2E, TPOT;
    and "stall_ms": how late the client's event loop woke from 5-ms sleeps (p99, max), a measure of
    how much of the machine the client got."""
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(32, 127, p)] for p in prompt]
    n = len(arrivals)
    sent, first, last, ptoks, toks = (np.zeros(n) for _ in range(5))

    async def one(client: httpx.AsyncClient, i: int, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        body = {"model": VLLM_MODEL, "prompt": prompts[i], "max_tokens": int(output[i]), "stream": True,
                "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
        sent[i] = time.perf_counter() - t0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now, chunk = time.perf_counter() - t0, json.loads(line[6:])
                if chunk.get("usage"):  # the exact count: a chunk may carry several tokens
                    ptoks[i], toks[i] = chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    first[i] = first[i] or now
                    last[i] = now

    late: list[float] = []

    async def heartbeat() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            late.append(time.perf_counter() - t - 0.005)

    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    beat = asyncio.create_task(heartbeat())
    async with httpx.AsyncClient(timeout=300, limits=limits, trust_env=False) as client:
        t0 = time.perf_counter() + 0.5
        await asyncio.gather(*(one(client, i, t0) for i in range(n)))
    beat.cancel()
    assert (toks == output).all()
    ttft, e2e = first - sent, last - sent
    return {"sent": sent, "prompt": ptoks.astype(int), "ttft": ttft, "e2e": e2e,
            "tpot": (e2e - ttft) / np.maximum(output - 1, 1),
            "stall_ms": (1000 * np.percentile(late, 99), 1000 * max(late))}


def simulate(real: dict, output, model_path) -> dict:
    from simulator.run import simulate as run
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    sc = load_scenario({"seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                        "router": {"policy": "round_robin"},
                        "pools": [{"name": "vllm", "latency_model": str(model_path), "replicas": 1,
                                   "settings_from_model": True, "frontend_from_model": True}]})
    wl = Workload(real["sent"] - real["sent"][0], real["prompt"].copy(), output.copy())
    f = run(sc, workload=wl, plots=False).fleet
    ttft = (f.requests.first_token - f.arrival_ps) / 1e12
    e2e = (f.requests.finish - f.arrival_ps) / 1e12
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / np.maximum(f.requests.generated - 1, 1)}


def calibrate(url: str, out, *extra: str) -> LatencyModel:
    from slopilot.cli import main

    argv = ["calibrate", "--from-server", url, "--out", str(out), "--budget", str(BUDGET), "--no-plot",
            "--max-num-seqs", str(VLLM_SETTINGS["max_num_seqs"]),
            "--max-num-batched-tokens", str(VLLM_SETTINGS["max_num_batched_tokens"]), *extra]
    assert main(argv) == 0
    return LatencyModel.load(out)


def compare(url: str, tmp_path, n: int, pairs: int, record: str | None = None) -> dict:
    arrivals, prompt, output = workload(n, seed=0)
    errors: dict[str, list[float]] = {}
    for pair in range(pairs):
        path = tmp_path / f"vllm-{pair}.json"
        model = calibrate(url, path)
        # read from vllm:cache_config_info (block size, KV blocks, prefix caching) or given
        read = dict(block_size=128, num_kv_blocks=2048, enable_prefix_caching=True, max_model_len=2048)
        assert model.engine_settings == {**read, **VLLM_SETTINGS}, model.engine_settings
        before = server_sums(url)
        real = asyncio.run(drive(url, arrivals, prompt, output, seed=100 + pair))
        after = server_sums(url)
        sim = simulate(real, output, path)
        print(f"pair {pair}: load average {os.getloadavg()[0]:.1f}; client event loop late by "
              f"{real['stall_ms'][0]:.1f} ms p99, {real['stall_ms'][1]:.0f} ms at most")
        for k, name in SERVER_SIDE.items():
            d = {part: after[name + part] - before[name + part] for part in ("_sum", "_count")}
            mean = d["_sum"] / d["_count"]
            print(f"pair {pair} {k} mean: vLLM's own /metrics {1000 * mean:.2f} ms, client "
                  f"{1000 * np.mean(real[k]):.2f} ms, sim {1000 * np.mean(sim[k]):.2f} ms")
        for k in ("ttft", "tpot", "e2e"):
            for q in (50, 90):
                r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
                errors.setdefault(f"{k} p{q}", []).append(s / r - 1)
                print(f"pair {pair} {k} p{q}: vLLM {1000 * r:.2f} ms, sim {1000 * s:.2f} ms "
                      f"({100 * (s / r - 1):+.1f}%)")
    report = {k: float(np.median(v)) for k, v in errors.items()}
    print("median error over the pairs: " + json.dumps(report))
    if record:  # docs/benchmarks/vllm_cpu.md's table, when asked for (bench/pages.py)
        from bench.pages import record_from_test

        record_from_test(record, ["measure", "sim / vLLM - 1, each pair", "median", "bar"],
                         [[k.upper(), ", ".join(f"{100 * e:+.1f}%" for e in errors[k]), f"{100 * e:+.1f}%",
                           f"{100 * (P50_TOL if k.endswith('p50') else P90_TOL):.0f}%"]
                          for k, e in report.items()],
                         [f"vllm-cpu serving the random 3.7M-parameter Llama, {n} Poisson requests, against "
                          f"the simulator calibrated from its /metrics (calibrate --from-server); {pairs} "
                          "calibrate-serve-simulate pairs."])
    return report


def check(report: dict) -> None:
    tol = {k: P50_TOL if k.endswith("p50") else P90_TOL for k in report}
    misses = {k: round(e, 3) for k, e in report.items() if abs(e) > tol[k]}
    if misses:
        pytest.xfail(f"simulated vs vLLM beyond 10% (p50) / 15% (p90): {misses}")


@pytest.mark.slow  # about three minutes; it misses the bar on a loaded machine (see the module doc)
def test_vllm_calibrated_simulation_one_pair(vllm_server, tmp_path):
    check(compare(vllm_server.url, tmp_path, 200, pairs=1))


@pytest.mark.slow
def test_vllm_calibrated_simulation_three_pairs(vllm_server, tmp_path):
    check(compare(vllm_server.url, tmp_path, 300, pairs=3, record="vllm_cpu.json"))
