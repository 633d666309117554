"""Twenty emulated H100 replicas at once on this machine, under closed-loop load, with their CPU use.

Starts --replicas `slopilot serve --emulate MODEL` processes, drives --streams closed-loop streams
against each for --seconds, and prints client-side TTFT and inter-token latency percentiles next
to the latency model's decode step for the same batch, plus each replica's CPU time (from
/proc/PID/stat) over the load window and their resident memory.

    .venv/bin/python bench/emulated_fleet.py [--replicas 20] [--streams 4] [--seconds 20]
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

from simulator.latency import load_latency_model  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def drive(urls: list[str], args) -> dict:
    ttft, itl, tokens = [], [], 0
    stop_at = time.perf_counter() + args.seconds
    rng = random.Random(0)

    async def stream(client: httpx.AsyncClient, url: str) -> None:
        nonlocal tokens
        while time.perf_counter() < stop_at:
            prompt = "".join(rng.choice("abcdefghijklmnop ") for _ in range(args.prompt_len - 1))
            body = {"prompt": prompt, "max_tokens": args.max_tokens, "stream": True, "ignore_eos": True}
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

    limits = httpx.Limits(max_connections=len(urls) * args.streams)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        await asyncio.gather(*(stream(c, u) for u in urls for _ in range(args.streams)))
    return {"ttft": ttft, "itl": itl, "tokens": tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=20)
    p.add_argument("--streams", type=int, default=4, help="closed-loop streams per replica")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--emulate", default="h100-llama2-70b-tp4")
    p.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = p.parse_args()
    procs, urls = [], []
    t_start = time.perf_counter()
    for _ in range(args.replicas):
        port = free_port()
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--emulate", args.emulate, "--port", str(port)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        pending = set(urls)
        while pending:
            for u in list(pending):
                try:
                    if httpx.get(u + "/health").status_code == 200:
                        pending.discard(u)
                except httpx.TransportError:
                    pass
            if time.perf_counter() - t_start > 300:
                raise SystemExit(f"{len(pending)} replicas did not start")
            time.sleep(0.2)
        startup = time.perf_counter() - t_start
        cpu0 = [cpu_seconds(pr.pid) for pr in procs]
        own0, t0 = os.times(), time.perf_counter()
        result = asyncio.run(drive(urls, args))
        wall = time.perf_counter() - t0
        own1 = os.times()
        cpu = [cpu_seconds(pr.pid) - c for pr, c in zip(procs, cpu0)]
        rss = [rss_mib(pr.pid) for pr in procs]
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            pr.wait(30)
    model = load_latency_model(args.emulate)
    ctx = args.streams * (args.prompt_len + args.max_tokens // 2)
    decode_ms = model.step_ms(0, 0, args.streams, ctx)
    client_cpu = (own1.user - own0.user) + (own1.system - own0.system)
    print(f"{args.replicas} emulated {args.emulate} replicas, {args.streams} streams each, "
          f"prompt {args.prompt_len}, {args.max_tokens} tokens, {wall:.1f} s of load; all healthy "
          f"{startup:.1f} s after launch")
    print(f"tokens streamed: {result['tokens']} ({result['tokens'] / wall:.0f} tok/s over the fleet)")
    for key in ("ttft", "itl"):
        xs = result[key]
        ps = [percentile(xs, q) * 1e3 for q in (50, 90, 99)]
        print(f"{key.upper():4s} ms: p50 {ps[0]:7.1f}  p90 {ps[1]:7.1f}  p99 {ps[2]:7.1f}  (n={len(xs)})")
    print(f"model decode step at batch {args.streams}, context {ctx}: {decode_ms:.1f} ms; "
          f"p50 ITL / model = {percentile(result['itl'], 50) * 1e3 / decode_ms:.3f}")
    print(f"replica CPU: total {sum(cpu) / wall:.2f} cores, per replica median "
          f"{statistics.median(cpu) / wall * 100:.1f}% (max {max(cpu) / wall * 100:.1f}%); "
          f"load generator {client_cpu / wall:.2f} cores")
    print(f"replica RSS: median {statistics.median(rss):.0f} MiB, total {sum(rss):.0f} MiB")
    if args.json:
        from bench.pages import write_result

        ps = {k: [percentile(result[k], q) * 1e3 for q in (50, 90, 99)] for k in ("ttft", "itl")}
        write_result(args.json, ["", "value"], [
            ["replicas healthy after launch", f"{startup:.1f} s"],
            ["tokens streamed over the fleet", f"{result['tokens']:,} in {wall:.1f} s = "
                                               f"{result['tokens'] / wall:,.0f} tok/s"],
            ["client TTFT p50 / p90 / p99", " / ".join(f"{x:.0f}" for x in ps["ttft"]) + " ms"],
            ["client ITL p50 / p90 / p99", " / ".join(f"{x:.1f}" for x in ps["itl"]) + " ms"],
            [f"latency model's decode step, batch {args.streams}, context {ctx:,}",
             f"{decode_ms:.1f} ms (p50 ITL / model = {ps['itl'][0] / decode_ms:.3f})"],
            [f"CPU of the {args.replicas} replicas during the load",
             f"{sum(cpu) / wall:.2f} cores in total (median {statistics.median(cpu) / wall * 100:.1f}% of a "
             f"core each, max {max(cpu) / wall * 100:.1f}%)"],
            ["CPU of the load generator", f"{client_cpu / wall:.2f} cores"],
            [f"resident memory of the {args.replicas} replicas",
             f"{statistics.median(rss):.0f} MiB each, {sum(rss):,.0f} MiB in total"]],
            notes=[f"{args.replicas} `slopilot serve --emulate {args.emulate}` processes, {args.streams} "
                   f"closed-loop streams each, prompts of {args.prompt_len} tokens, {args.max_tokens} output "
                   f"tokens, {args.seconds:g} s of load."])


if __name__ == "__main__":
    main()
