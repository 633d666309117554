"""Precise prefix routing, live: `slopilot serve` engines publish KV events (--kv-events-config) to the
router's SUB socket, and the router's precise-prefix-cache-scorer picks the engine that holds a
prompt's blocks. Then the Mooncake conversation trace through approximate and precise routing on
three tiny engines under KV pressure (the setting of test_router_prefix_live), their hit rates side
by side with the simulator's."""

from __future__ import annotations

import json
import re
import tempfile
import time

import httpx
import pytest

from tests.e2e.conftest import free_port, wait_healthy
from tests.e2e.test_router_openai import Engine, start_router
from tests.e2e.test_router_prefix_live import (
    BLOCK,
    MAX_LEN,
    PATIENT,
    TRACE,
    affinity_config,
    arrivals,
    cache_counters,
    live_hit_rate,
    outputs,
    prompts,
    read_trace,
    simulated_hit_rate,
    single_cache_bound,
)


class EventEngine(Engine):
    """`slopilot serve ARGS` publishing its KV events to tcp://127.0.0.1:ZMQ_PORT, topic kv@HOST:PORT@tiny."""

    def __init__(self, zmq_port: int, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{zmq_port}",
               "topic": f"kv@127.0.0.1:{self.port}@tiny"}
        self.args = (*args, "--kv-events-config", json.dumps(cfg))
        self.log = tempfile.TemporaryFile()
        self.start()


def precise_config(zmq_port: int, weights: dict[str, float]) -> dict:
    cfg = affinity_config({"queue": weights["queue"], "kv": weights["kv"],
                           "prefix": weights["precise_prefix"]})  # its prefix plugin replaced:
    cfg["plugins"][2] = {"type": "precise-prefix-cache-scorer", "name": "prefix-cache-scorer", "parameters": {
        "tokenizer": "byte", "blockSize": BLOCK, "zmqEndpoint": f"tcp://127.0.0.1:{zmq_port}"}}
    return cfg


def test_precise_scorer_sends_a_prompt_back_to_the_engine_holding_it():
    zmq_port = free_port()
    engines = [EventEngine(zmq_port, "--emulate", "cpu-tiny", "--block-size", str(BLOCK)) for _ in range(3)]
    try:
        wait_healthy(engines, timeout=120)
        urls = [e.url for e in engines]
        config = {"kind": "EndpointPickerConfig", "dataLayer": PATIENT, "plugins": [
            {"type": "precise-prefix-cache-scorer", "parameters": {
                "blockSize": BLOCK, "zmqEndpoint": f"tcp://127.0.0.1:{zmq_port}"}},
            {"type": "max-score-picker"}]}
        prompt = list(range(3, 3 + 10 * BLOCK + 5))
        with start_router(urls, config) as router:
            index = router.state.gate.router.kv_index
            # The engines' PUB sockets connect to the router's SUB once it binds, each at its next
            # reconnect (ZMQ retries every 100 ms), and a PUB drops what it sends before it has the
            # subscription: a batch published before that reaches nobody, and this router takes no
            # replay address (docs/kv_events.md). So first, straight to each engine, a new 2-block
            # prompt of its own (a repeat would be a cache hit: no event) until the router has heard
            # every engine.
            end, attempt = time.monotonic() + 30, 0
            while time.monotonic() < end and not all(index.blocks(u) >= 2 for u in urls):
                attempt += 1
                for i, u in enumerate(urls):
                    if index.blocks(u) < 2:
                        r = httpx.post(u + "/v1/completions", timeout=60, trust_env=False, json={
                            "model": "tiny", "prompt": [3 + (3 * attempt + i) % 250] * (2 * BLOCK + 1),
                            "max_tokens": 1})
                        assert r.status_code == 200, r.text
                time.sleep(0.2)
            assert all(index.blocks(u) >= 2 for u in urls), {u: index.blocks(u) for u in urls}
            post = lambda: httpx.post(router.url + "/v1/completions", timeout=60, trust_env=False,  # noqa: E731
                                      json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
            assert post().status_code == 200
            end = time.monotonic() + 30  # the engine's events reach the router
            while time.monotonic() < end and not any(index.blocks(u) >= 12 for u in urls):
                time.sleep(0.1)
            holder = [u for u in urls if index.blocks(u) >= 12]
            assert len(holder) == 1, {u: index.blocks(u) for u in urls}
            h0, _ = cache_counters(urls)
            for _ in range(5):
                assert post().status_code == 200
            h1, _ = cache_counters(urls)
            page = httpx.get(router.url + "/metrics", timeout=10, trust_env=False).text
        assert f'slopilot_router_kv_index_blocks{{endpoint="{holder[0]}",medium="GPU"}}' in page
        assert "slopilot_router_kv_events_resyncs_total 0.0" in page
        # every repeat found its 10 blocks cached: all went to the one engine holding them
        assert h1 - h0 == 5 * 10 * BLOCK
    finally:
        for e in engines:
            e.stop()


@pytest.mark.slow  # several minutes: two phases of the trace on three real tiny engines
@pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE}")
def test_precise_vs_approximate_on_mooncake_under_kv_pressure():
    import os

    n, speedup, kv_blocks = int(os.environ.get("PRECISE_LIVE_N", "1000")), 12, 4500
    offload = os.environ.get("PRECISE_LIVE_OFFLOAD_GIB")  # e.g. 0.125: an offload tier on each engine
    weights = {"queue": 1.0, "kv": 1.0, "prefix": 4.0}
    rows = read_trace(n)
    max_tokens, times = outputs(rows), arrivals(rows, speedup)
    zmq_port = free_port()
    tier = ("--kv-offloading-size", offload) if offload else ()
    engines = [EventEngine(zmq_port, "--model", "tiny", "--max-model-len", str(MAX_LEN), "--block-size",
                           str(BLOCK), "--num-kv-blocks", str(kv_blocks), *tier) for _ in range(3)]
    try:
        wait_healthy(engines, timeout=180)
        urls = [e.url for e in engines]
        ids_a, ids_p = prompts(rows, salt=2), prompts(rows, salt=3)
        precise = {"queue": 1.0, "kv": 1.0, "precise_prefix": 4.0}
        res, tiers = {}, {}
        for name, cfg, ids in (("approximate", affinity_config(weights), ids_a),
                               ("precise", precise_config(zmq_port, precise), ids_p)):
            (h0, q0), e0 = cache_counters(urls), external_counters(urls)
            res[name] = live_hit_rate(urls, cfg, ids, max_tokens, times)
            (h1, q1), e1 = cache_counters(urls), external_counters(urls)
            tiers[name] = (h1 - h0 + e1[0] - e0[0]) / (q1 - q0)  # device and tier hits over queries
    finally:
        for e in engines:
            e.stop()
    res["sim_approximate"] = simulated_hit_rate({"policy": "weighted", "weights": weights}, ids_a, max_tokens,
                                                times, kv_blocks)
    res["sim_precise"] = simulated_hit_rate({"policy": "weighted", "weights": precise}, ids_p, max_tokens,
                                            times, kv_blocks)
    res["bound"] = single_cache_bound(ids_p)
    print(f"{n} requests over {times[-1]:.1f} s, 3 engines x {kv_blocks} blocks, offload tier {offload} GiB, "
          "device prefix-cache hit rate: " + ", ".join(f"{k} {v:.1%}" for k, v in res.items())
          + "; device or offload tier: "
          + ", ".join(f"{k} {v:.1%}" for k, v in tiers.items()))
    assert res["precise"] >= 0.95 * res["approximate"]
    if not offload:  # the simulator here has no tier
        assert abs(res["precise"] - res["sim_precise"]) <= 0.10


def external_counters(urls: list[str]) -> tuple[float, float]:
    """(hit tokens, queried tokens) of the engines' offload tiers (vLLM's external prefix cache)."""
    hits = queries = 0.0
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
        hits += sum(float(v) for v in re.findall(
            r"^vllm:external_prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M))
        queries += sum(float(v) for v in re.findall(
            r"^vllm:external_prefix_cache_queries_total(?:\{[^}]*\})? (\S+)$", text, re.M))
    return hits, queries
