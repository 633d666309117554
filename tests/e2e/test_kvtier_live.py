"""Issue 32's first must-show, live beside the simulator: the first 4,000 Mooncake conversation requests
through the router to three `serve --model tiny` engines under KV pressure (4,500 blocks each, as the
router's prefix test), for {no offload, offload tier of 0.125 GiB} x {approximate prefix scorer,
precise scorer fed by the engines' KV events}: prefix hit rate (device + offload tier) and prompt
tokens computed per cell, live from the engines' /metrics and simulated on the same token ids and
arrival times (tests/e2e/test_kvtier_cells.py); the simulator within 3 points of live on every cell.

Each engine set (without, then with the tier) serves the approximate phase and then the precise one,
each phase's prompts salted apart (no phase hits the other's blocks), as the prefix test does.
Live, prompt tokens computed = tokens looked up - device hits - tier hits (every looked-up token not
found is computed); the simulator counts them step by step.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile

import httpx
import pytest

from tests.e2e.conftest import wait_healthy
from tests.e2e.test_kvtier_cells import (
    APPROXIMATE,
    KV_BLOCKS,
    OFFLOAD_GIB,
    SPEEDUP,
    N,
    sim_cell,
)
from tests.e2e.test_router_openai import Engine, start_router
from tests.e2e.test_router_prefix_live import (
    BLOCK,
    MAX_LEN,
    PATIENT,
    TRACE,
    affinity_config,
    arrivals,
    outputs,
    prompts,
    read_trace,
    replay,
)
from tests.server_helpers import free_port

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE}")


def precise_config(zmq: str) -> dict:
    """The approximate config with the precise scorer (KV events on `zmq`) in the prefix scorer's place."""
    weights = {"queue": APPROXIMATE["queue"], "kv": APPROXIMATE["kv"], "precise": APPROXIMATE["prefix"]}
    return {"kind": "EndpointPickerConfig", "plugins": [
        {"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
        {"type": "precise-prefix-cache-scorer",
         "parameters": {"tokenizer": "byte", "blockSize": BLOCK, "zmqEndpoint": zmq}},
        {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": weights["queue"]},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": weights["kv"]},
            {"pluginRef": "precise-prefix-cache-scorer", "weight": weights["precise"]},
            {"pluginRef": "max-score-picker"}]}], "dataLayer": PATIENT}


class EventEngine(Engine):
    """`serve tiny` publishing its KV events to the router's SUB socket, the topic naming its URL."""

    def __init__(self, zmq_port: int, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://127.0.0.1:{zmq_port}", "topic": f"kv@127.0.0.1:{self.port}@tiny"}
        self.args = (*args, "--kv-events-config", json.dumps(events))
        self.log = tempfile.TemporaryFile()
        self.start()


def counters(urls: list[str]) -> dict[str, float]:
    names = ("prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_hits")
    out = dict.fromkeys(names, 0.0)
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
        for n in names:
            out[n] += sum(float(v) for v in re.findall(rf"^vllm:{n}_total(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return out


def live_cell(urls: list[str], config: dict, ids, max_tokens, times) -> dict:
    model = httpx.get(urls[0] + "/v1/models", trust_env=False).json()["data"][0]["id"]
    c0 = counters(urls)
    with start_router(urls, config) as router:
        codes = asyncio.run(replay(router.url, model, ids, max_tokens, times))
    assert codes == [200] * len(ids), {c: codes.count(c) for c in set(codes)}
    c1 = counters(urls)
    d = {k: c1[k] - c0[k] for k in c0}
    q, dev, off = d["prefix_cache_queries"], d["prefix_cache_hits"], d["external_prefix_cache_hits"]
    return {"hit_rate": (dev + off) / q, "device_hit_rate": dev / q, "offload_hit_rate": off / q,
            "prefill_tokens_computed": int(q - dev - off), "queried_tokens": int(q)}


def run_cells(n: int = N) -> dict:
    rows = read_trace(n)
    max_tokens, times = outputs(rows), arrivals(rows, SPEEDUP)
    salts = {"approximate": 11, "precise": 12}
    ids = {route: prompts(rows, salt) for route, salt in salts.items()}
    res = {}
    for offload in (False, True):
        zmq_port = free_port()
        extra = ["--kv-offloading-size", str(OFFLOAD_GIB)] if offload else []
        engines = [EventEngine(zmq_port, "--model", "tiny", "--max-model-len", str(MAX_LEN), "--block-size",
                               str(BLOCK), "--num-kv-blocks", str(KV_BLOCKS), *extra) for _ in range(3)]
        try:
            wait_healthy(engines, timeout=180)
            urls = [e.url for e in engines]
            configs = {"approximate": affinity_config(APPROXIMATE),
                       "precise": precise_config(f"tcp://127.0.0.1:{zmq_port}")}
            for route in ("approximate", "precise"):
                res[(offload, route, "live")] = live_cell(urls, configs[route], ids[route], max_tokens, times)
        finally:
            for e in engines:
                e.stop()
        for route in ("approximate", "precise"):
            res[(offload, route, "sim")] = sim_cell(offload, route == "precise", ids[route], max_tokens,
                                                    times)
    for (offload, route, where), c in sorted(res.items()):
        print(f"{'offload' if offload else 'no offload':>10} / {route:<11} {where:>4}: "
              f"hit {c['hit_rate']:.1%} (device {c['device_hit_rate']:.1%}, "
              f"tier {c['offload_hit_rate']:.1%}), "
              f"prompt tokens computed {c['prefill_tokens_computed']:,} of {c['queried_tokens']:,}")
    return res


@pytest.mark.slow  # four live phases of 4,000 requests on three tiny engines, and their simulations
def test_kvtier_cells_live_match_the_simulator():
    res = run_cells()
    for offload in (False, True):
        for route in ("approximate", "precise"):
            live, sim = res[(offload, route, "live")], res[(offload, route, "sim")]
            assert abs(live["hit_rate"] - sim["hit_rate"]) <= 0.03, (offload, route, live, sim)
    assert res[(True, "approximate", "live")]["offload_hit_rate"] > 0
