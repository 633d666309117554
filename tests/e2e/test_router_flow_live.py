"""Flow control at the router, end to end on emulated engines: overload at 5x the fleet's measured
capacity with two priority bands, and scale from zero with the controller on the router's queue metric.

Each test prints its figures (capacity, offered rate, per-band TTFT percentiles and status counts,
the highest waiting queue seen on an engine).
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

from autoscaler.spec import load_spec, make_policy
from controlplane.controller import AutoscalerLoop, Controller
from controlplane.fleet import LocalFleet, load_fleet_config
from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.endpoints import read_gauges
from controlplane.router.server import RouterServer
from controlplane.sources import ScrapeSource
from routing.config import load_router_config

MODEL = "h100-llama2-70b-tp4"
THRESHOLD = 2  # waiting requests per engine at which the gateway holds requests
HIGH_SLO = 3.0  # seconds: the high band's TTFT p90 objective


def flow_config(low_capacity: int) -> dict:
    return {"kind": "EndpointPickerConfig",
            "plugins": [{"type": "queue-scorer"}, {"type": "active-request-scorer"},
                        {"type": "max-score-picker"}],
            "saturationDetector": {"queueDepthThreshold": THRESHOLD, "kvCacheUtilThreshold": 0.95},
            "flowControl": {"priorityBands": [
                {"priority": 10, "name": "high", "maxRequests": 200, "ttl": "60s"},
                {"priority": 0, "name": "low", "maxRequests": low_capacity, "ttl": "60s"}]}}


async def one(client: httpx.AsyncClient, url: str, band: str, max_tokens: int, out: list) -> None:
    """A streamed completion; appends (band, status, TTFT s or None)."""
    t0 = time.monotonic()
    body = {"prompt": "flow " * 40, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    try:
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 headers={"x-slopilot-priority": band}) as r:
            ttft = None
            async for chunk in r.aiter_bytes():
                if ttft is None and chunk:
                    ttft = time.monotonic() - t0
            out.append((band, r.status_code, ttft if r.status_code == 200 else None))
    except httpx.HTTPError as exc:
        out.append((band, type(exc).__name__, None))


async def watch_waiting(urls: list[str], stop: asyncio.Event, seen: list[int]) -> None:
    async with httpx.AsyncClient(trust_env=False) as c:
        while not stop.is_set():
            for u in urls:
                try:
                    seen.append(int(read_gauges((await c.get(u + "/metrics")).text)[0].get("num_waiting", 0)))
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.05)


async def capacity(url: str, max_tokens: int, concurrency: int, seconds: float) -> float:
    """Completed requests per second with `concurrency` clients back to back (a closed loop)."""
    done = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120, trust_env=False) as c:
        async def worker():
            while time.monotonic() < end:
                await one(c, url, "high", max_tokens, done)
        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return sum(1 for d in done if d[1] == 200) / (time.monotonic() - t0)


@pytest.mark.slow  # about 25 s on two shared cores
def test_overload_two_bands(emulated_servers):
    urls = emulated_servers(2, "--max-num-seqs", "4")
    max_tokens, duration = 24, 8.0
    app = build_router_app(load_router_config(flow_config(low_capacity=30)), static(urls))
    with RouterServer(app) as router:
        cap = asyncio.run(capacity(router.url, max_tokens, concurrency=12, seconds=4.0))
        rate = 5 * cap
        results: list = []
        seen: list[int] = []

        async def run():
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_waiting(urls, stop, seen))
            rng = np.random.default_rng(0)
            async with httpx.AsyncClient(timeout=180, trust_env=False,
                                         limits=httpx.Limits(max_connections=2000)) as c:
                tasks, t0, k = [], time.monotonic(), 0
                while k < rate * duration:
                    await asyncio.sleep(max(0.0, t0 + k / rate - time.monotonic()))
                    band = "high" if rng.random() < 0.1 else "low"
                    tasks.append(asyncio.create_task(one(c, router.url, band, max_tokens, results)))
                    k += 1
                await asyncio.gather(*tasks)
            stop.set()
            await watcher
            return k

        sent = asyncio.run(run())
    by = {b: [r for r in results if r[0] == b] for b in ("high", "low")}
    ttft = {b: np.array([r[2] for r in rs if r[1] == 200]) for b, rs in by.items()}
    codes = {b: {str(c): sum(1 for r in rs if r[1] == c) for c in {r[1] for r in rs}} for b, rs in by.items()}
    p90 = {b: float(np.percentile(t, 90)) if len(t) else None for b, t in ttft.items()}
    print(f"\ncapacity {cap:.1f} req/s, offered {rate:.1f} req/s for {duration:g}s ({sent} requests); "
          f"statuses {codes}; TTFT p50/p90 high {np.percentile(ttft['high'], 50):.2f}/{p90['high']:.2f}s, "
          f"low {np.percentile(ttft['low'], 50):.2f}/{p90['low']:.2f}s; max engine waiting {max(seen)} "
          f"(threshold {THRESHOLD}, {len(seen)} samples)")
    assert len(results) == sent  # every request answered exactly once (one outcome each)
    assert max(seen) <= THRESHOLD
    assert p90["high"] <= HIGH_SLO
    assert p90["low"] > p90["high"]  # the low band absorbs the wait
    assert codes["low"].get("429", 0) > 0 and set(codes["low"]) <= {"200", "429"}
    assert set(codes["high"]) == {"200"}


def test_scale_from_zero_with_the_controller(tmp_path):
    fleet_cfg = load_fleet_config({"name": "zero", "emulate": MODEL, "replicas": 0, "min_replicas": 0,
                                   "max_replicas": 1, "drain_timeout": 5, "start_timeout": 90})
    router_cfg = load_router_config({"kind": "EndpointPickerConfig", "flowControl": {"priorityBands": [
        {"priority": 0, "name": "standard", "ttl": "90s"},
        {"priority": 5, "name": "impatient", "ttl": "1s"}]}})
    spec = load_spec({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "zero"},
                      "spec": {"scaleTargetRef": {"name": "zero"}, "pollingInterval": 1,
                               "cooldownPeriod": 300, "minReplicaCount": 0, "maxReplicaCount": 1,
                               "triggers": [
                                   {"type": "prometheus", "name": "queue", "metadata": {
                                       "serverAddress": "http://unused", "threshold": "1",
                                       "activationThreshold": "0",
                                       "query": "sum(llm_d_epp_flow_control_queue_size)"}}]}})
    with LocalFleet(fleet_cfg, tmp_path / "fleet", wait_ready=False) as fleet:
        with RouterServer(build_router_app(router_cfg, fleet.endpoints)) as router:
            source = ScrapeSource([router.url])
            loop = AutoscalerLoop(spec, make_policy(spec), source, fleet)
            stop = threading.Event()
            ctl = threading.Thread(target=Controller([loop]).run, args=(stop,), daemon=True)
            ctl.start()
            try:
                t0 = time.monotonic()
                body = {"prompt": "wake up", "max_tokens": 8}
                with httpx.Client(timeout=120, trust_env=False) as c:
                    out = {}

                    def held():
                        out["held"] = c.post(router.url + "/v1/completions", json=body)
                        out["held_s"] = time.monotonic() - t0

                    t = threading.Thread(target=held)
                    t.start()
                    time.sleep(0.2)
                    late = c.post(router.url + "/v1/completions", json=body,
                                  headers={"x-slopilot-priority": "impatient"})
                    late_s = time.monotonic() - t0
                    t.join()
                scale = next((e for e in fleet.events if e["event"] == "scale"), None)
                step = loop.last_step
            finally:
                stop.set()
                ctl.join(timeout=10)
                source.close()
    print(f"\nimpatient request: {late.status_code} after {late_s:.1f}s; held request: "
          f"{out['held'].status_code} after {out['held_s']:.1f}s; scale event {scale}; last step {step}")
    assert late.status_code == 503 and "TTL" in late.json()["error"]["message"]
    assert out["held"].status_code == 200 and out["held"].json()["usage"]["completion_tokens"] == 8
    assert fleet_cfg.min_replicas == 0 and (scale.get("frm"), scale.get("to")) == (0, 1)
