"""Closed-loop HTTP load on `slopilot serve --model tiny` against offline LLM.generate, same prompts.

N client streams each send their next request as soon as the last one finished, over loopback, to
a server in its own process; the baseline is LLM.generate on the same prompts with the same engine
settings (max_num_seqs = N) in this process. Both use --threads torch threads (default 1: on a
shared 2-core machine, OpenMP's spinning threads slow the tiny model several-fold when the cores
are busy). Prints throughput, client-side TTFT and inter-token latency percentiles, and the HTTP
path's cost as the ratio of the two wall times; medians of --repeats runs.

    .venv/bin/python bench/server_load.py [--concurrency 16] [--requests 128] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "queue replica token cache batch prefill decode latency scale metric fleet".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(n)]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--model", args.model, "--port", str(port),
           "--max-num-seqs", str(args.concurrency), "--max-model-len", str(args.max_model_len)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


async def closed_loop(url: str, prompts: list[str], args) -> dict:
    todo = list(reversed(prompts))
    ttft, itl, tokens = [], [], 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while todo:
            body = {"model": args.model, "prompt": todo.pop(), "max_tokens": args.max_tokens, "stream": True,
                    "temperature": 0, "ignore_eos": True}
            sent = last = time.perf_counter()
            first = True
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter()
                    if "error" in json.loads(line[6:]):
                        raise SystemExit(f"server error: {line}")
                    (ttft if first else itl).append(now - (sent if first else last))
                    first, last = False, now
                    tokens += 1

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=args.concurrency)) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": tokens, "ttft": ttft, "itl": itl}


def offline(prompts: list[str], args) -> float:
    import torch

    from engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(args.model, max_num_seqs=args.concurrency, max_model_len=args.max_model_len)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:4], params)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    assert sum(len(o.token_ids) for o in outs) == len(prompts) * args.max_tokens
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads, server and offline alike")
    p.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = p.parse_args()
    prompts = make_prompts(args.requests, 0)
    proc, url = start_server(args)
    try:
        asyncio.run(closed_loop(url, prompts[:args.concurrency], args))  # warm-up
        runs = []
        for _ in range(args.repeats):
            runs.append(asyncio.run(closed_loop(url, prompts, args)))
            runs[-1]["offline"] = offline(prompts, args)
    finally:
        proc.terminate()
        proc.wait(30)
    total = args.requests * args.max_tokens
    for r in runs:
        assert r["tokens"] == total, (r["tokens"], total)
    med = statistics.median
    http_tps = med(r["tokens"] / r["wall"] for r in runs)
    off_tps = med(total / r["offline"] for r in runs)
    ratio = med(r["wall"] / r["offline"] for r in runs)
    print(f"{args.requests} requests x {args.max_tokens} tokens, {args.concurrency} concurrent streams, "
          f"model {args.model}, {args.threads} torch thread(s), medians of {args.repeats} runs")
    print(f"HTTP server     : {http_tps:8.1f} output tok/s")
    print(f"offline generate: {off_tps:8.1f} output tok/s")
    print(f"HTTP wall / offline wall = {ratio:.2f}x  (throughput ratio {http_tps / off_tps:.2f})")
    pct = {}
    for key in ("ttft", "itl"):
        ps = pct[key] = {q: med(percentile(r[key], q) * 1e3 for r in runs) for q in (50, 90, 99)}
        print(f"{key.upper():4s} ms: p50 {ps[50]:7.2f}  p90 {ps[90]:7.2f}  p99 {ps[99]:7.2f}")
    if args.json:
        from bench.pages import write_result

        write_result(args.json, ["model", "HTTP out tok/s", "offline out tok/s", "HTTP wall / offline wall",
                                 "TTFT p50 / p90 / p99 ms", "ITL p50 / p90 / p99 ms"],
                     [[f"{args.model} ({args.requests} req x {args.max_tokens} tok, "
                       f"{args.concurrency} streams)",
                       round(http_tps, 1), round(off_tps, 1), f"{ratio:.2f}x",
                       " / ".join(f"{pct['ttft'][q]:.0f}" for q in (50, 90, 99)),
                       " / ".join(f"{pct['itl'][q]:.1f}" for q in (50, 90, 99))]],
                     notes=[f"`slopilot serve --model {args.model}` in its own process, closed-loop "
                            "streaming clients over loopback, against `LLM.generate` on the same prompts "
                            f"in-process; {args.threads} torch thread(s); medians of {args.repeats} runs."])


if __name__ == "__main__":
    main()
