"""The fidelity protocol against our own `serve --model tiny`, calibrated two ways on the same server:
black-box (`calibrate --from-server`: the probe load over HTTP) and white-box (`profile --from-run`, a
serving profile of the engine in process, fitted with the mean matched). A Poisson workload of
streamed requests is sent over HTTP (arrival times and lengths recorded by the client); the simulator
gets the same arrivals and lengths, the pool's settings from the model (settings_from_model), and the
HTTP path: drawn per request from the black-box model's front end, the idle median for the white-box.
Each percentile's error is reported for both calibrations.

The slow check repeats the calibrate-serve-simulate pair three times and takes the median error per
percentile (10% on medians, 15% on p90), as tests/simulator/test_sim_fidelity.py does; the short one (one
pair, medians within 50%) is a check of the pipeline. Both are kept out of `make test` (minutes each).
Measured (three pairs, quiet machine): black-box within every bar (TTFT -6.2% / -4.8%, TPOT +5.0% /
-3.7%, E2E +5.3% / +5.2%), each request's front end drawn from the probe's idle requests (a pool with
frontend_from_model; with the median alone TTFT p90 came out 26% low). White-box (the in-process
profile) misses TPOT by 35% at p50: the server's pace includes its HTTP streaming, which only the
outside probe measures.
"""

import asyncio
import json
import os
import time

import httpx
import numpy as np
import pytest
from test_calibrate_server import ENGINE, calibrate_from, start_server, stop

RATE = 8.0


def _workload(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / RATE, n))
    return arrivals - arrivals[0], rng.integers(64, 193, n), rng.integers(16, 49, n)


async def _drive(url: str, arrivals, prompt, output, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(32, 127, p)] for p in prompt]
    n = len(arrivals)
    sent, first, last, ptoks, toks = (np.zeros(n) for _ in range(5))

    async def one(client: httpx.AsyncClient, i: int, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        body = {"model": "tiny", "prompt": prompts[i], "max_tokens": int(output[i]), "stream": True,
                "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
        sent[i] = time.perf_counter() - t0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now, chunk = time.perf_counter() - t0, json.loads(line[6:])
                if chunk.get("usage"):
                    ptoks[i] = chunk["usage"]["prompt_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    first[i] = now if toks[i] == 0 else first[i]
                    toks[i] += 1
                    last[i] = now

    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        t0 = time.perf_counter() + 0.5
        await asyncio.gather(*(one(client, i, t0) for i in range(n)))
    assert (toks == output).all()
    ttft, e2e = first - sent, last - sent
    return {"sent": sent, "prompt": ptoks.astype(int), "ttft": ttft, "e2e": e2e,
            "tpot": (e2e - ttft) / np.maximum(output - 1, 1)}


def _http_ms(url: str, model, requests: int = 10) -> float:
    """Median idle TTFT less the model's prefill step (the white-box model's view of the HTTP path)."""
    rng = np.random.default_rng(5)
    extra = []
    with httpx.Client(timeout=60) as client:
        for i in range(requests):
            n = 64 + 12 * i
            body = {"model": "tiny", "prompt": [int(t) for t in rng.integers(32, 127, n)], "max_tokens": 1,
                    "stream": True, "ignore_eos": True}
            t0, ttft = time.perf_counter(), None
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if ttft is None and line.startswith("data: {"):
                        ttft = time.perf_counter() - t0
            extra.append(1000 * ttft - model.step_ms(n, n, 0, 0))
            time.sleep(0.05)
    return max(0.0, float(np.median(extra)))


def _simulate(real: dict, output, model_path, http_ms: float | None, wakeup_ms: float = 0.0) -> dict:
    """http_ms: the HTTP path as one latency; None: each request's drawn from the model's front end."""
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    sc = load_scenario({"seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                        "router": {"policy": "round_robin", "latency_ms": http_ms or 0.0},
                        "pools": [{"name": "tiny", "latency_model": str(model_path), "replicas": 1,
                                   "settings_from_model": True, "wakeup_ms": wakeup_ms,
                                   "frontend_from_model": http_ms is None}]})
    wl = Workload(real["sent"] - real["sent"][0], real["prompt"].copy(), output.copy())
    f = simulate(sc, workload=wl, plots=False).fleet
    ttft = (f.requests.first_token - f.arrival_ps) / 1e12
    e2e = (f.requests.finish - f.arrival_ps) / 1e12
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / np.maximum(f.requests.generated - 1, 1)}


def _white_box(tmp_path, n: int):
    """profile --from-run on the engine in process, one torch thread, fitted with the mean matched."""
    from simulator.latency.fit import fit
    from simulator.latency.profile import read_metadata, read_profile
    from slopilot.cli import main

    csv_path = tmp_path / "tiny-serving.csv"
    argv = ["profile", "--from-run", "--model", "tiny", "--out", str(csv_path), "--threads", "1",
            "--requests", str(n), "--rate", str(RATE), "--prompt-tokens", "32-256", "--output-tokens", "8-64",
            "--seed", "11", "--max-num-seqs", str(ENGINE["max_num_seqs"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"])]
    assert main(argv) == 0
    model = fit(read_profile(csv_path), match_mean=True)
    return model, read_metadata(csv_path)["from_run"]["wakeup_ms"] or 0.0


def _compare(tmp_path, n: int, budget: float, pairs: int, p50_tol: float, p90_tol: float, capsys) -> dict:
    arrivals, prompt, output = _workload(n)
    errors: dict[str, dict[str, list[float]]] = {"black-box": {}, "white-box": {}}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    flags = ["--model", "tiny", "--max-num-seqs", str(ENGINE["max_num_seqs"]),
             "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"])]
    for pair in range(pairs):
        d = tmp_path / f"pair{pair}"
        d.mkdir()
        white, wakeup_ms = _white_box(d, n)
        white.engine_settings = {}
        proc, url = start_server(flags, env=env)
        try:
            black, printed = calibrate_from(url, d / "black.json", budget, capsys)
            white_http = _http_ms(url, white)
            real = asyncio.run(_drive(url, arrivals, prompt, output, seed=100 + pair))
        finally:
            stop(proc)
        white.engine_settings = black.engine_settings  # the same server's settings for both
        white.save(d / "white.json")
        print(printed)
        sims = {"black-box": _simulate(real, output, d / "black.json", None),
                "white-box": _simulate(real, output, d / "white.json", white_http, wakeup_ms)}
        for way, sim in sims.items():
            for k in ("ttft", "tpot", "e2e"):
                for q in (50, 90):
                    r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
                    errors[way].setdefault(f"{k} p{q}", []).append(s / r - 1)
                    print(f"pair {pair} {way} {k} p{q}: server {1000 * r:.2f} ms, sim {1000 * s:.2f} ms "
                          f"({100 * (s / r - 1):+.1f}%)")
    report = {way: {k: float(np.median(v)) for k, v in e.items()} for way, e in errors.items()}
    print("median error over the pairs: " + json.dumps(report))
    for k, e in report["black-box"].items():
        assert abs(e) <= (p50_tol if k.endswith("p50") else p90_tol), (k, report)
    return report


@pytest.mark.slow
def test_tiny_server_black_and_white_box_short(tmp_path, capsys):
    _compare(tmp_path, 100, budget=25, pairs=1, p50_tol=0.5, p90_tol=float("inf"), capsys=capsys)


@pytest.mark.slow
def test_tiny_server_black_and_white_box_300(tmp_path, capsys):
    _compare(tmp_path, 300, budget=60, pairs=3, p50_tol=0.10, p90_tol=0.15, capsys=capsys)
