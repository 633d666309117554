"""Aggregated vs disaggregated, live: emulated H100 Llama-70B replicas behind the router, same arrivals.

Three fleets of 4 replicas each (`serve --emulate llama-3.1-70b@h100-sxm-tp4-bf16`, TP4 replicas, as
bench/pd_sim.py's), each behind its own `slopilot route` process: 4 aggregated replicas; 1 prefill + 3
decode; 2 prefill + 2 decode (kv_producer / kv_consumer engines, the router's P/D profile with
--pd-threshold, emulated KV transfer over the `rdma` link class: latency + bytes / 50 GB/s). Prompt and
output lengths are drawn from the Mooncake conversation trace (prompts capped at --max-prompt tokens,
outputs at --max-output), arrivals are gamma (CV 1.5) at --rate; each request goes to the three
fleets at the same moment (random token ids, no prefix shared), streamed, and the client times the
first token and the last: TTFT, TPOT = (last - first) / (tokens - 1), per request. Goodput: requests
meeting both the TTFT and the TPOT SLO (per request), per second of the arrival window, for each
--tpot-slo given (default 100 ms and 40 ms, on the same run).

The emulator has no time scale: the run is in real time, the three fleets side by side (12 engine
processes, 3 routers and this client on the same cores), so a run takes --duration + up to --drain
seconds plus start-up. A request still unanswered at the drain deadline counts as missing its SLO,
with its wait so far as a lower bound of its TTFT.

    .venv/bin/python bench/pd_live.py [--rate 0.4] [--duration 120] [--drain 90] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-70b@h100-sxm-tp4-bf16"
CONFIGS = {"aggregated 4": (0, 4), "1P + 3D": (1, 3), "2P + 2D": (2, 2)}  # (prefill, decode) replicas
# prefix caching stays on (a producer finds its blocks through it); random prompts never hit it
ENGINE = ["--max-model-len", "65536", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192"]


def trace_path() -> Path:
    """The Mooncake conversation trace in the shared data folder ($SLOPILOT_SHARED_DATA, or a `shared/data`
    beside the checkout or one level up, as a worktree has it)."""
    for base in (os.environ.get("SLOPILOT_SHARED_DATA"), ROOT.parent / "shared" / "data",
                 ROOT.parent.parent / "shared" / "data"):
        if base and (Path(base) / "traces" / "mooncake_conversation.jsonl").is_file():
            return Path(base) / "traces" / "mooncake_conversation.jsonl"
    raise SystemExit("the Mooncake trace was not found: set SLOPILOT_SHARED_DATA to the shared data folder")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty process never blocks on it
        self.proc = subprocess.Popen([sys.executable, "-m", "slopilot.cli", *args, "--port", str(self.port)],
                                     cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, deadline: float) -> None:
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                tail = self.log.read()[-1500:].decode(errors="replace")
                raise RuntimeError(f"{self.url} did not start: {tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def kv(role: str) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": "TcpConnector", "kv_role": role,
                                                "kv_connector_extra_config": {"link": "rdma"}})]


def start(model: str, threshold: int) -> tuple[list[Proc], dict[str, str], dict[str, list[str]]]:
    """Every fleet's engines, then its router; (processes, config -> router URL, config -> decode
    engines' URLs)."""
    procs, routers, fleets = [], {}, {}
    for name, (n_p, n_d) in CONFIGS.items():
        pre = [Proc(["serve", "--emulate", model, *ENGINE, *kv("kv_producer")]) for _ in range(n_p)]
        dec = [Proc(["serve", "--emulate", model, *ENGINE, *(kv("kv_consumer") if n_p else [])])
               for _ in range(n_d)]
        fleets[name] = (pre, dec)
        procs += pre + dec
    deadline = time.monotonic() + 300
    for p in procs:
        p.wait(deadline)
    for name, (pre, dec) in fleets.items():
        args = ["route", *[a for d in dec for a in ("--endpoint", d.url)]]
        if pre:
            args += [a for p in pre for a in ("--prefill-endpoint", p.url)]
            args += ["--pd-threshold", str(threshold)]
        r = Proc(args)
        procs.append(r)
        routers[name] = r.url
    for name in routers:
        next(p for p in procs if p.url == routers[name]).wait(time.monotonic() + 60)
    return procs, routers, {name: [d.url for d in dec] for name, (_, dec) in fleets.items()}


def sums(url: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram over every label set on one /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    total = count = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10, trust_env=False).text):
        for sample in fam.samples:
            if sample.name == name + "_sum":
                total += sample.value
            elif sample.name == name + "_count":
                count += sample.value
    return total, count


def hops(router: str, decode: list[str]) -> str:
    """The mean prefill hop (router) and KV pull (decode engines) of a P/D fleet's disaggregated requests."""
    hop = sums(router, "slopilot_router_prefill_hop_seconds")
    pulls = [sums(u, "vllm:nixl_xfer_time_seconds") for u in decode]
    pull = (sum(p[0] for p in pulls), sum(p[1] for p in pulls))
    mean = lambda sc: f"{sc[0] / sc[1] * 1e3:.0f} ms" if sc[1] else "-"  # noqa: E731
    return f"prefill hop mean {mean(hop)} ({hop[1]:.0f}), KV pull mean {mean(pull)} ({pull[1]:.0f})"


@dataclass
class Request:
    at: float  # seconds after the start
    prompt: int
    output: int
    ids: list[int] = field(default_factory=list)


def workload(rate: float, duration: float, seed: int, max_prompt: int, max_output: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    rows = [json.loads(line) for line in open(trace_path())]
    cv = 1.5
    shape = 1 / cv**2
    t, out = 0.0, []
    while True:
        t += rng.gamma(shape, 1 / (rate * shape))
        if t >= duration:
            return out
        row = rows[rng.integers(len(rows))]
        p, o = min(int(row["input_length"]), max_prompt), min(max(int(row["output_length"]), 2), max_output)
        out.append(Request(t, p, o, rng.integers(3, 500, size=p).tolist()))


@dataclass
class Result:
    ttft: float | None = None  # None: no token by the drain deadline
    tpot: float | None = None
    waited: float = 0.0
    status: int = 0
    tokens: int = 0


async def one(client: httpx.AsyncClient, url: str, req: Request, t0: float, res: Result, model: str) -> None:
    await asyncio.sleep(max(0.0, t0 + req.at - time.monotonic()))
    sent = time.monotonic()
    body = {"model": model, "prompt": req.ids, "max_tokens": req.output, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    first = last = None
    tail = ""
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            res.status = r.status_code
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.monotonic()
                if '"text": ""' not in line or first is not None:
                    first = first or now
                    last = now
                tail = line
    except (httpx.TransportError, asyncio.CancelledError):
        res.waited = time.monotonic() - sent
        if first is not None:
            res.ttft = first - sent
        raise
    res.waited = time.monotonic() - sent
    try:
        res.tokens = json.loads(tail[6:]).get("usage", {}).get("completion_tokens", 0) if tail else 0
    except ValueError:
        res.tokens = 0
    if first is not None and res.status == 200:
        res.ttft = first - sent
        res.tpot = (last - first) / (res.tokens - 1) if res.tokens > 1 else None


async def drive(routers: dict[str, str], reqs: list[Request], drain: float) -> dict[str, list[Result]]:
    results = {name: [Result() for _ in reqs] for name in routers}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    timeout = httpx.Timeout(None, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as c:
        model = (await c.get(next(iter(routers.values())) + "/v1/models")).json()["data"][0]["id"]
        t0 = time.monotonic() + 1.0
        tasks = [asyncio.create_task(one(c, url, q, t0, results[name][i], model))
                 for name, url in routers.items() for i, q in enumerate(reqs)]
        end = t0 + (reqs[-1].at if reqs else 0) + drain
        _, pending = await asyncio.wait(tasks, timeout=max(1.0, end - time.monotonic()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return results


def row(name: str, res: list[Result], duration: float, ttft_slo: float, tpot_slos: list[float]) -> str:
    ttft = np.array([r.ttft if r.ttft is not None else r.waited for r in res])  # waits: lower bounds
    tpot = np.array([r.tpot for r in res if r.tpot is not None])
    unfinished = sum(1 for r in res if r.tpot is None)
    cells = []
    for tpot_slo in tpot_slos:
        good = sum(1 for r in res if r.ttft is not None and r.ttft <= ttft_slo and r.tpot is not None
                   and r.tpot <= tpot_slo and r.status == 200)
        cells.append(f"{good / duration:.3f} | {good / len(res):.2f}")

    def ms(a, q):
        return f"{np.percentile(a, q) * 1e3:.0f}" if len(a) else "-"

    return (f"| {name} | {ms(ttft, 50)} | {ms(ttft, 90)} | {ms(tpot, 50)} | {ms(tpot, 90)} | "
            f"{' | '.join(cells)} | {unfinished} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=0.4, help="requests/s (gamma arrivals, CV 1.5)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    ap.add_argument("--drain", type=float, default=90.0, help="seconds after the last arrival to finish")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--model", default=MODEL, help="the emulated engines' latency model (a derived one)")
    ap.add_argument("--threshold", type=int, default=1024, help="the router's --pd-threshold")
    ap.add_argument("--max-prompt", type=int, default=32000)
    ap.add_argument("--max-output", type=int, default=1024)
    ap.add_argument("--ttft-slo", type=float, default=5.0, help="seconds, per request")
    ap.add_argument("--tpot-slo", type=float, nargs="+", default=[0.1, 0.04],
                    help="seconds, per request: goodput and attainment for each")
    args = ap.parse_args()
    reqs = workload(args.rate, args.duration, args.seed, args.max_prompt, args.max_output)
    prompts = [q.prompt for q in reqs]
    print(f"{len(reqs)} requests in {args.duration:g} s; prompts mean {np.mean(prompts):.0f}, median "
          f"{np.median(prompts):.0f} tokens; outputs mean {np.mean([q.output for q in reqs]):.0f}",
          flush=True)
    procs = []
    try:
        t_start = time.monotonic()
        procs, routers, decoders = start(args.model, args.threshold)
        print(f"started {len(procs)} processes in {time.monotonic() - t_start:.0f} s; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        load_before = os.getloadavg()[0]
        t_run = time.monotonic()
        results = asyncio.run(drive(routers, reqs, args.drain))
        load_after = os.getloadavg()
        print(f"ran {time.monotonic() - t_run:.0f} s; load average {load_before:.1f} before, "
              f"{load_after[0]:.1f} / {load_after[1]:.1f} (1 / 5 min) after\n")
        print(f"SLO per request: TTFT <= {args.ttft_slo:g} s and TPOT <= the column's\n")
        slos = "".join(f" goodput req/s, TPOT <= {t * 1e3:g} ms | attainment |" for t in args.tpot_slo)
        print(f"| config | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |{slos} unfinished |")
        print("|---" * (6 + 2 * len(args.tpot_slo)) + "|")
        for name, res in results.items():
            print(row(name, res, args.duration, args.ttft_slo, args.tpot_slo))
        bad = {name: sorted({r.status for r in res if r.status not in (0, 200)})
               for name, res in results.items()}
        if any(bad.values()):
            print(f"\nnon-200 answers: {bad}")
        print()
        for name, (n_p, _) in CONFIGS.items():
            if n_p:
                print(f"{name}: {hops(routers[name], decoders[name])}")
    finally:
        for p in procs:
            p.stop()


if __name__ == "__main__":
    main()
