"""Prefix affinity, live: the Mooncake conversation trace (equal hash_ids = a shared 512-token prefix
block) through the router to three `serve --model tiny` engines with prefix caching. The engines' own
prefix-cache hit rate (their /metrics counters) under the prefix-aware config is compared with
round robin, and each with what the simulator predicts for the same requests and routing policy.

The trace is scaled down 32x in tokens so it fits the tiny model: a 512-token hash block becomes one
16-token engine block (block size 16), so block equality, the only thing the prefix cache sees, is
the trace's. Hash blocks become fixed random byte tokens, salted per phase: the same three engines
serve both policies without the first phase's cache helping the second. Arrival times are the
trace's, compressed; output is capped (only the prompt's prefill reaches the prefix cache).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from simulator.fleet import Fleet
from simulator.report import summarize
from simulator.requests import SimSequence
from simulator.scenario import load_scenario
from simulator.workload import Workload
from tests.e2e.conftest import ROOT, wait_healthy
from tests.e2e.test_router_openai import Engine, start_router

SHARED = Path(os.environ.get("SLOPILOT_SHARED_DATA", ROOT.parent / "shared" / "data"))
TRACE = SHARED / "traces" / "mooncake_conversation.jsonl"
SCALE = 32  # trace tokens per prompt token
BLOCK = 16  # the engines' block size, and the trace's 512-token block scaled
MAX_LEN = 1024  # the tiny model's context
MAX_OUTPUT = 2
KV_BLOCKS = 24_000  # per engine: both phases' blocks stay cached (no eviction)
WEIGHTS = {"queue": 1.0, "kv": 1.0, "prefix": 2.0}
# a busy shared machine: slow answers and scrapes are not failures here
PATIENT = {"connectTimeout": "30s", "scrapeTimeout": "10s", "ejectAfter": 20}

def affinity_config(weights: dict[str, float]) -> dict:
    return {"kind": "EndpointPickerConfig", "plugins": [
        {"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-cache-scorer", "parameters": {"tokenizer": "byte", "blockSize": BLOCK}},
        {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": weights["queue"]},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": weights["kv"]},
            {"pluginRef": "prefix-cache-scorer", "weight": weights["prefix"]},
            {"pluginRef": "max-score-picker"}]}], "dataLayer": PATIENT}


ROUND_ROBIN = {"kind": "EndpointPickerConfig", "plugins": [{"type": "round-robin-picker"}],
               "dataLayer": PATIENT}

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE}")


def read_trace(n: int) -> list[dict]:
    rows = []
    with TRACE.open() as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def prompts(rows: list[dict], salt: int) -> list[list[int]]:
    """Each request's token ids: one fixed random block per hash id, then request-unique tokens."""
    blocks: dict[int, list[int]] = {}
    out = []
    for i, row in enumerate(rows):
        n = min(math.ceil(row["input_length"] / SCALE), MAX_LEN - MAX_OUTPUT)
        ids: list[int] = []
        for h in row["hash_ids"]:
            if len(ids) >= n:
                break
            if h not in blocks:
                blocks[h] = np.random.default_rng([salt, h]).integers(0, 256, BLOCK).tolist()
            ids += blocks[h]
        if len(ids) < n:
            ids += np.random.default_rng([salt, 1 << 40, i]).integers(0, 256, n - len(ids)).tolist()
        out.append(ids[:n])
    return out


def outputs(rows: list[dict]) -> list[int]:
    return [max(1, min(MAX_OUTPUT, row["output_length"] // SCALE)) for row in rows]


def arrivals(rows: list[dict], speedup: float) -> np.ndarray:
    t = np.array([row["timestamp"] for row in rows], dtype=float) / 1000
    return (t - t[0]) / speedup


def single_cache_bound(ids: list[list[int]]) -> float:
    """The hit rate of one unbounded cache seeing every request: no routing over separate caches
    can do better."""
    seen: set[tuple] = set()
    hits = queries = 0
    for x in ids:
        blocks = [tuple(x[:k + BLOCK]) for k in range(0, len(x) - BLOCK + 1, BLOCK)]  # chained: the prefix
        n = next((i for i, b in enumerate(blocks) if b not in seen), len(blocks))
        hits += n * BLOCK
        queries += len(x)
        seen.update(blocks)
    return hits / queries


def cache_counters(urls: list[str]) -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over the engines' /metrics."""
    hits = queries = 0.0
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
        hits += sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$",
                                                  text, re.M))
        queries += sum(float(v) for v in re.findall(
            r"^vllm:prefix_cache_queries_total(?:\{[^}]*\})? (\S+)$", text, re.M))
    return hits, queries


async def replay(base: str, model: str, ids: list[list[int]], max_tokens: list[int], times: np.ndarray
                 ) -> list[int]:
    """Sends each request at its time; the HTTP status of each."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # no idle-close races
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits, trust_env=False) as client:
        async def one(i: int) -> int:
            await asyncio.sleep(max(0.0, t0 + times[i] - loop.time()))
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": ids[i], "max_tokens": max_tokens[i], "ignore_eos": True})
            return r.status_code

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        return await asyncio.gather(*(one(i) for i in range(len(ids))))


def live_hit_rate(engines: list[str], config: dict, ids, max_tokens, times) -> float:
    model = httpx.get(engines[0] + "/v1/models", trust_env=False).json()["data"][0]["id"]
    h0, q0 = cache_counters(engines)
    with start_router(engines, config) as router:
        codes = asyncio.run(replay(router.url, model, ids, max_tokens, times))
    assert codes == [200] * len(ids), {c: codes.count(c) for c in set(codes)}
    h1, q1 = cache_counters(engines)
    return (h1 - h0) / (q1 - q0)


class TokenFleet(Fleet):
    """The simulator's fleet fed the exact token ids sent to the live engines."""

    token_ids: list[list[int]] = []

    def make_seq(self, i: int) -> SimSequence:
        return SimSequence(i, self.token_ids[i], int(self.wl.output[i]), int(self.arrival_ps[i]))


def simulated_hit_rate(router: dict, ids, max_tokens, times, kv_blocks: int = KV_BLOCKS) -> float:
    sc = load_scenario({
        "name": "mooncake-live", "seed": 0, "duration": float(times[-1]) + 1,
        "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 1, "output_tokens": 1},  # replaced below
        "pools": [{"name": "tiny", "latency_model": "cpu-tiny", "replicas": 3, "autoscaler": {"fixed": 3},
                   "kv_blocks": kv_blocks, "block_size": BLOCK, "max_model_len": MAX_LEN,
                   "prefix_caching": True}],
        "router": router, "drain": {"enabled": True, "max": 600},
    })
    wl = Workload(times, np.array([len(x) for x in ids]), np.array(max_tokens))
    fleet = type("Fleet", (TokenFleet,), {"token_ids": ids})(sc, wl, seed=0)
    fleet.run()
    return summarize(fleet)["pools"]["tiny"]["prefix_cache_hit_rate"]


def jittered_round_robin(ids, max_tokens, times, kv_blocks: int, runs: int = 6, jitter_s: float = 0.01
                         ) -> float:
    """Round robin's simulated hit rate averaged over arrival orders shuffled by up to 10 ms: live, the
    order in which near-simultaneous requests reach the router varies, and with it which engine each
    conversation's next turn lands on (trace order is one draw of that)."""
    rates = []
    for seed in range(runs):
        t = times + np.random.default_rng(seed).uniform(0, jitter_s, len(times))
        order = np.argsort(t, kind="stable")
        rates.append(simulated_hit_rate({"policy": "round_robin"}, [ids[i] for i in order],
                                        [max_tokens[i] for i in order], t[order], kv_blocks))
    return float(np.mean(rates))


def check_prefix_affinity(n: int, speedup: float, *engine: str, kv_blocks: int = KV_BLOCKS,
                          weights: dict[str, float] = WEIGHTS) -> dict:
    """Hit rates of round robin and the prefix-aware config, live on three `serve ENGINE...` and
    simulated, over the trace's first n requests at `speedup` times their pace, kv_blocks per engine."""
    rows = read_trace(n)
    max_tokens, times = outputs(rows), arrivals(rows, speedup)
    engines = [Engine(*engine, "--max-model-len", str(MAX_LEN), "--block-size", str(BLOCK),
                      "--num-kv-blocks", str(kv_blocks)) for _ in range(3)]
    try:
        wait_healthy(engines, timeout=180)
        urls = [e.url for e in engines]
        ids_rr, ids_aff = prompts(rows, salt=1), prompts(rows, salt=2)
        res = {"round_robin": live_hit_rate(urls, ROUND_ROBIN, ids_rr, max_tokens, times),
               "affinity": live_hit_rate(urls, affinity_config(weights), ids_aff, max_tokens, times)}
    finally:
        for e in engines:
            e.stop()
    rr = {"policy": "round_robin"}
    res["sim_round_robin"] = simulated_hit_rate(rr, ids_rr, max_tokens, times, kv_blocks)
    res["sim_round_robin_jittered"] = jittered_round_robin(ids_rr, max_tokens, times, kv_blocks)
    res["sim_affinity"] = simulated_hit_rate({"policy": "weighted", "weights": weights}, ids_aff, max_tokens,
                                             times, kv_blocks)
    res["bound"] = single_cache_bound(ids_aff)
    print(f"{n} requests over {times[-1]:.1f} s, prefix-cache hit rate: "
          + ", ".join(f"{k} {v:.1%}" for k, v in res.items()))
    return res


def test_prefix_affinity_live_matches_the_simulator():
    # emulated engines (the real scheduler and block manager, steps timed by the cpu-tiny model) and
    # the trace's first 300 requests: conversations are young there, affinity wins less than 2x
    res = check_prefix_affinity(300, 20, "--emulate", "cpu-tiny")
    # here even one cache holding every prompt hits only ~9.4% of prompt tokens, and round robin's share
    # rides on the arrival order (5.0% simulated in trace order, 6.0% over jittered orders, 7.4% and
    # 7.9% live in two runs), so a fixed 1.25x margin over round robin failed on lucky orders (7.4%
    # against affinity's 9.2%). The router is measured against that ceiling instead: prefix-aware
    # placement gets nearly all of it.
    assert res["affinity"] >= 0.85 * res["bound"] and res["affinity"] > res["round_robin"]
    assert abs(res["affinity"] - res["sim_affinity"]) <= 0.10
    assert abs(res["round_robin"] - res["sim_round_robin"]) <= 0.10


@pytest.mark.slow  # about 2.5 minutes on two shared cores
def test_prefix_affinity_live_doubles_round_robin():
    # the trace's first 1000 requests: even one cache holding everything hits 21% of prompt tokens
    # (the bound), and round robin gets about half of that (the system-prompt block hits on every
    # engine, a conversation's next turn lands where its last one did one time in three); affinity
    # gets near the bound, so the ratio sits at about 2x, the most any routing can reach here
    res = check_prefix_affinity(1000, 12, "--model", "tiny")
    assert res["affinity"] >= 0.85 * res["bound"]
    # measured 1.73-1.91x: round robin's own rate moves with the arrival order (10.6-12.8% live; 11.5%
    # simulated over jittered orders), which puts the expected ratio at about 1.9x on this window
    assert res["affinity"] >= 1.7 * res["round_robin"]
    assert abs(res["affinity"] - res["sim_affinity"]) <= 0.10
    assert abs(res["round_robin"] - res["sim_round_robin"]) <= 0.10


@pytest.mark.slow  # about 5 minutes
def test_prefix_affinity_live_under_kv_pressure():
    # the first 4000 requests on engines of 4,500 blocks each (72,000 tokens; the requests have 55,333
    # distinct blocks): round robin keeps a copy of every conversation on every engine and they evict each
    # other, prefix affinity keeps one; prefix weight 4 (the bound's weight, measured above). Measured
    # 1.99x and 2.08x live, 2.04x simulated
    res = check_prefix_affinity(4000, 12, "--model", "tiny", kv_blocks=4500,
                                weights={"queue": 1.0, "kv": 1.0, "prefix": 4.0})
    assert res["affinity"] >= 1.8 * res["round_robin"]
    assert abs(res["affinity"] - res["sim_affinity"]) <= 0.10
    assert abs(res["round_robin"] - res["sim_round_robin_jittered"]) <= 0.10
