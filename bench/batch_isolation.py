"""Interactive latency with and without a 20,000-line batch submitted at once (issue 31's isolation).

Emulated engines (`serve --emulate h100-llama2-70b-tp4`, by default `--scheduling-policy priority
--background-priority 1`) behind `slopilot route` (its own process) with flow control: an
`interactive` band (10) and a `batch` band (0) held at a quarter of the detector's thresholds, batch
lines sent with engine priority 1 (`--batch-engine-priority`). The interactive load is Poisson
streaming completions of distinct ~1000-token prompts (no prefix shared) and 32 output tokens at
--load of the engines' capacity: the saturated throughput of one engine for this shape, measured
first in virtual time on the same engine code and latency model (bench/batch_virtual.py), times --engines.

Each round serves the load for --duration s alone, then submits the batch (--lines lines of ~64
tokens, 16 output tokens, window --window) and serves the same load (same seed) again beside it,
then waits for the batch to end. TTFT and TPOT p90 are measured by the client (first chunk; mean gap
between chunks). Prints each round, the medians over rounds and the load average.

    .venv/bin/python bench/batch_isolation.py [--rounds 3] [--duration 60] [--lines 20000] [--fcfs]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batch_virtual import EMULATED, capacity  # noqa: E402
from bench.pages import write_result  # noqa: E402
from tests.e2e.conftest import EmulatedServer, free_port, wait_healthy  # noqa: E402

MODEL = "llama2-70b"
PROMPT_CHARS, OUTPUT = 1000, 32  # the interactive shape (the byte tokenizer: ~1 token a character)
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
ROUTER = {"kind": "EndpointPickerConfig",
          "saturationDetector": {"queueDepthThreshold": 16, "kvCacheUtilThreshold": 0.9},
          "flowControl": {"priorityBands": [
              {"priority": 10, "name": "interactive", "maxRequests": 5000, "ttl": "60s"},
              {"priority": 0, "name": "batch", "maxRequests": 5000, "ttl": "600s", "saturation": 0.25}]},
          "dataLayer": {"refreshInterval": "50ms"}}


def prompt(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS) + str(rng.randrange(1000)))
    return " ".join(words)[:chars]


async def interactive(url: str, rate: float, duration: float, seed: int,
                      salt: int) -> tuple[float, float, int]:
    """(TTFT p90, TPOT p90, requests) of a Poisson load of streaming completions: arrival times from
    seed, prompts from salt (a run's own, or the engines' prefix caches would serve a repeated run)."""
    client = httpx.AsyncClient(timeout=300, trust_env=False, limits=httpx.Limits(max_connections=2000))
    rng, words = random.Random(seed), random.Random(salt)
    ttft, tpot = [], []

    async def one(text: str) -> None:
        t0, first, last, n = time.monotonic(), None, None, 0
        body = {"model": MODEL, "prompt": text, "max_tokens": OUTPUT, "ignore_eos": True, "stream": True}
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
        tasks.append(asyncio.create_task(one(prompt(words, PROMPT_CHARS))))
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    await asyncio.gather(*tasks)
    await client.aclose()
    return float(np.percentile(ttft, 90)), float(np.percentile(tpot, 90)), len(tasks)


def start_router(urls: list[str], state_dir: str, fcfs: bool) -> tuple[subprocess.Popen, str]:
    config = Path(state_dir) / "router.json"
    config.write_text(json.dumps(ROUTER))
    port = free_port()
    cmd = [sys.executable, "-m", "slopilot.cli", "route", "--config", str(config), "--port", str(port),
           "--state-dir", state_dir, "--batch-max-inflight", "64", "--log-level", "warning",
           *[a for u in urls for a in ("--endpoint", u)]]
    if not fcfs:
        cmd += ["--batch-engine-priority", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/v1/models", trust_env=False, timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the router did not start (exit {proc.poll()})")
        time.sleep(0.2)


def submit(url: str, lines: int, window: str, seed: int) -> tuple[openai.OpenAI, str]:
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=2)
    rng = random.Random(-1 - seed)
    rows = [json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": MODEL, "prompt": prompt(rng, 64), "max_tokens": 16,
                                 "ignore_eos": True}}, separators=(",", ":")) for i in range(lines)]
    f = c.files.create(file=("b.jsonl", io.BytesIO("\n".join(rows).encode())), purpose="batch")
    return c, c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window=window).id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of interactive load a run")
    ap.add_argument("--load", type=float, default=0.8, help="interactive rate as a share of capacity")
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--window", default="1h", help="the batch's completion_window")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--fcfs", action="store_true", help="engines without --background-priority (before)")
    ap.add_argument("--json", help="write the rounds' table here (the page's results/batch_isolation.json)")
    args = ap.parse_args()
    cap = capacity()
    rate = args.load * cap * args.engines
    kind = "fcfs" if args.fcfs else "background priority"
    print(f"capacity {cap:.2f} req/s an engine (virtual time); interactive load {rate:.2f} req/s on "
          f"{args.engines} engines ({args.load:.0%}); engines {kind}", flush=True)
    flags = () if args.fcfs else ("--scheduling-policy", "priority", "--background-priority", "1")
    engines = [EmulatedServer("--max-num-seqs", "64", *flags, model=EMULATED) for _ in range(args.engines)]
    rows = []
    try:
        wait_healthy(engines)
        with tempfile.TemporaryDirectory() as state:
            router, url = start_router([e.url for e in engines], state, args.fcfs)
            try:
                asyncio.run(interactive(url, rate, 10, 99, 99))  # warm-up, not recorded
                for r in range(args.rounds):
                    alone = asyncio.run(interactive(url, rate, args.duration, r, 1000 + 2 * r))
                    c, bid = submit(url, args.lines, args.window, r)
                    t0 = time.monotonic()
                    beside = asyncio.run(interactive(url, rate, args.duration, r, 1001 + 2 * r))
                    during = c.batches.retrieve(bid).request_counts.completed
                    while (b := c.batches.retrieve(bid)).status not in ("completed", "failed", "expired"):
                        time.sleep(1.0)
                    took, load = time.monotonic() - t0, os.getloadavg()[0]
                    rows.append((alone, beside, during, b.status, b.request_counts.completed, took, load))
                    print(f"round {r}: TTFT p90 {alone[0] * 1000:.0f} -> {beside[0] * 1000:.0f} ms "
                          f"({100 * (beside[0] / alone[0] - 1):+.1f}%), TPOT p90 {alone[1] * 1000:.1f} -> "
                          f"{beside[1] * 1000:.1f} ms ({100 * (beside[1] / alone[1] - 1):+.1f}%), "
                          f"{alone[2]}/{beside[2]} requests; batch {b.status} {b.request_counts.completed}/"
                          f"{args.lines} in {took:.0f} s ({during} during the load); load {load:.1f}",
                          flush=True)
            finally:
                router.terminate()
                router.wait(30)
    finally:
        for e in engines:
            e.stop()
    med = [statistics.median(100 * (row[1][k] / row[0][k] - 1) for row in rows) for k in (0, 1)]
    print(f"median over {len(rows)} rounds: TTFT p90 {med[0]:+.1f}%, TPOT p90 {med[1]:+.1f}%; batch "
          f"done in {statistics.median(row[5] for row in rows):.0f} s (window {args.window}); load average "
          f"{min(row[6] for row in rows):.1f}-{max(row[6] for row in rows):.1f}")
    if args.json:
        table = [[str(i), kind, round(a[0] * 1000), round(b[0] * 1000), round(100 * (b[0] / a[0] - 1), 1),
                  round(a[1] * 1000, 1), round(b[1] * 1000, 1), round(100 * (b[1] / a[1] - 1), 1),
                  f"{st} {done}/{args.lines}", round(took), round(ld, 1)]
                 for i, (a, b, _, st, done, took, ld) in enumerate(rows)]
        notes = [f"{args.engines} emulated engines, interactive load {args.load:.0%} of capacity "
                 f"({rate:.2f} req/s) for {args.duration:.0f} s alone, then again beside a "
                 f"{args.lines:,}-line batch (window {args.window}); median over {len(rows)} round(s): "
                 f"TTFT p90 {med[0]:+.1f}%, TPOT p90 {med[1]:+.1f}% (the issue's bar: within 10%)."]
        columns = ["round", "scheduling", "TTFT p90 alone ms", "beside batch ms", "TTFT change %",
                   "TPOT p90 alone ms", "beside batch ms", "TPOT change %", "batch", "batch took s", "load"]
        write_result(args.json, columns, table, notes)


if __name__ == "__main__":
    main()
