"""Interactive latency with and without a Batch API batch running beside it (issue 31's isolation).

One or more emulated engines (`serve --emulate h100-llama2-70b-tp4`), the router in this process with
flow control (an `interactive` band at priority 10, a `batch` band at 0 held at --saturation of the
detector's thresholds: queue 4, KV 0.9), and a Poisson load of streaming interactive completions
(200-word prompts, 32 output tokens) for --duration seconds: first alone, then again right after a
batch of --lines completions (100-word prompts, 16 output tokens) is submitted. Prints the TTFT and
TPOT p90 of each run (client-side: first chunk, mean gap between chunks), the batch's progress
during the second run and when it completed, and the load average.

    .venv/bin/python bench/batch_isolation.py [--rate 4] [--duration 30] [--saturation 0.25] [--lines 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.router.app import build_router_app  # noqa: E402
from controlplane.router.config import load_router_config  # noqa: E402
from controlplane.router.discovery import static  # noqa: E402
from controlplane.router.server import RouterServer  # noqa: E402
from tests.e2e.conftest import EmulatedServer, wait_healthy  # noqa: E402

MODEL = "llama2-70b"


def flow(saturation: float) -> dict:
    return {"kind": "EndpointPickerConfig",
            "saturationDetector": {"queueDepthThreshold": 4, "kvCacheUtilThreshold": 0.9},
            "flowControl": {"priorityBands": [
                {"priority": 10, "name": "interactive", "maxRequests": 5000, "ttl": "60s"},
                {"priority": 0, "name": "batch", "maxRequests": 5000, "ttl": "60s",
                 "saturation": saturation}]},
            "dataLayer": {"refreshInterval": "50ms"}}


async def interactive(url: str, rate: float, duration: float, seed: int) -> tuple[float, float, int]:
    """(TTFT p90, TPOT p90, requests) of a Poisson load of streaming completions."""
    client = httpx.AsyncClient(timeout=120, trust_env=False, limits=httpx.Limits(max_connections=1000))
    rng = random.Random(seed)
    ttft, tpot = [], []

    async def one(i: int) -> None:
        t0, first, last, n = time.monotonic(), None, None, 0
        body = {"model": MODEL, "prompt": "word " * 200 + str(i), "max_tokens": 32, "ignore_eos": True,
                "stream": True}
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 headers={"x-slopilot-priority": "interactive"}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    last = time.monotonic()
                    first = first or last
                    n += 1
        ttft.append(first - t0)
        tpot.append((last - first) / max(1, n - 1))

    tasks, start = [], time.monotonic()
    due = start
    while due - start < duration:
        tasks.append(asyncio.create_task(one(len(tasks))))
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    await asyncio.gather(*tasks)
    await client.aclose()
    return float(np.percentile(ttft, 90)), float(np.percentile(tpot, 90)), len(tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=4.0, help="interactive requests a second")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--saturation", type=float, default=0.25, help="the batch band's saturation level")
    ap.add_argument("--lines", type=int, default=2000, help="lines of the batch")
    ap.add_argument("--batch-inflight", type=int, default=64)
    ap.add_argument("--engines", type=int, default=1)
    args = ap.parse_args()
    engines = [EmulatedServer("--max-num-seqs", "64") for _ in range(args.engines)]
    try:
        wait_healthy(engines)
        urls = [e.url for e in engines]
        app = build_router_app(load_router_config(flow(args.saturation)), static(urls),
                               batch_inflight=args.batch_inflight)
        with RouterServer(app) as router:
            alone = asyncio.run(interactive(router.url, args.rate, args.duration, 1))
            c = openai.OpenAI(base_url=router.url + "/v1", api_key="x")
            rows = [json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": MODEL, "prompt": "batch " * 100 + str(i), "max_tokens": 16,
                                         "ignore_eos": True}}) for i in range(args.lines)]
            f = c.files.create(file=("b.jsonl", io.BytesIO("\n".join(rows).encode())), purpose="batch")
            b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")
            t0 = time.monotonic()
            beside = asyncio.run(interactive(router.url, args.rate, args.duration, 1))
            during = c.batches.retrieve(b.id).request_counts.completed
            while c.batches.retrieve(b.id).status not in ("completed", "failed", "expired"):
                time.sleep(0.5)
            took = time.monotonic() - t0
        for name, (ttft, tpot, n) in (("alone", alone), ("with the batch", beside)):
            print(f"interactive {name:>14}: TTFT p90 {ttft * 1000:5.0f} ms, TPOT p90 {tpot * 1000:5.1f} ms "
                  f"({n} requests)")
        print(f"change: TTFT p90 {100 * (beside[0] / alone[0] - 1):+.0f}%, TPOT p90 "
              f"{100 * (beside[1] / alone[1] - 1):+.0f}%; batch: {during}/{args.lines} lines during the run, "
              f"completed {took:.0f} s after submission ({args.lines / took:.1f} lines/s); "
              f"load average {os.getloadavg()[0]:.1f}")
    finally:
        for e in engines:
            e.stop()


if __name__ == "__main__":
    main()
