"""The router's added latency and CPU: routed vs direct, streaming, in the same run over loopback.

Emulated engines (`serve --emulate`) in their own processes, the router (`slopilot route`, default
config: queue, KV and prefix scorers, 100 ms metric refresh) in its own, and one asyncio client (aiohttp)
sending Poisson arrivals at each rate; every arrival goes at random to the router or straight to an
engine (round robin), so both paths see the same engine load at the same moments. Prints, per
rate, TTFT p50/p99 of each path and their difference (what the router adds), and the router
process's CPU seconds per routed request (its /proc counters, the 100 ms scrapes included), the time
its threads spent runnable but waiting for a CPU per routed request (schedstat), and the 1-minute
load average at the end of each run. With --repeats N every rate runs N times, interleaved,
and a summary gives each column's median ("added" is the median of the runs' differences).

    .venv/bin/python bench/router_overhead.py [--rates 50 200 500] [--duration 20] [--repeats 3] [--json PATH]

`--picker round-robin` runs the router with that picker alone (no scorers): the direct path's own
placement, so the difference is the HTTP hop and the router's work, without the effect of where the
scorers put requests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = "h100-llama2-70b-tp4"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: list[str], start_timeout: float = 90) -> tuple[subprocess.Popen, str]:
    """A `slopilot` subcommand on a free port, once its /health answers 200."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "slopilot.cli", *args, "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{' '.join(args)} did not start")
        time.sleep(0.1)


def run_queue_seconds(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just ended
            pass
    return total / 1e9


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one(client: aiohttp.ClientSession, url: str, body: dict) -> float | None:
    t0 = time.perf_counter()
    async with client.post(url + "/v1/completions", json=body) as r:
        ttft = None
        async for chunk in r.content.iter_any():
            if ttft is None and chunk:
                ttft = time.perf_counter() - t0
        return ttft if r.status == 200 else None


async def run_rate(router: str, engines: list[str], rate: float, duration: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, int(rate * duration * 1.2) + 10)
    times = np.cumsum(gaps)
    times = times[times < duration]
    routed = rng.random(len(times)) < 0.5
    body = {"prompt": "hello " * 32, "max_tokens": 4, "ignore_eos": True, "stream": True}
    out: dict[str, list] = {"routed": [], "direct": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        async def send(i: int):
            url = router if routed[i] else engines[i % len(engines)]
            out["routed" if routed[i] else "direct"].append(await one(client, url, body))

        await asyncio.gather(*(send(i) for i in range(min(20, len(times)))))  # warm the connections
        out = {"routed": [], "direct": []}
        tasks, t0 = [], time.perf_counter()
        for i, t in enumerate(times):
            await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
            tasks.append(asyncio.create_task(send(i)))
        await asyncio.gather(*tasks)
        lag = time.perf_counter() - t0 - duration
    return {k: [x for x in v if x is not None] for k, v in out.items()} | {"sent": len(times),
                                                                            "lag": lag}


def http_stack() -> str:
    """The event loop and HTTP parser in the spawned processes (same env): uvicorn's "auto" picks in
    the engines; the router's own server takes uvloop when installed and always httptools."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} + {http}"


def measure(router: str, engines: list[str], rproc: subprocess.Popen, rate: float, duration: float,
            seed: int) -> dict:
    cpu0, wait0 = cpu_seconds(rproc.pid), run_queue_seconds(rproc.pid)
    r = asyncio.run(run_rate(router, engines, rate, duration, seed))
    cpu = cpu_seconds(rproc.pid) - cpu0
    wait = run_queue_seconds(rproc.pid) - wait0
    d, t = np.array(r["direct"]) * 1000, np.array(r["routed"]) * 1000
    p50 = (np.percentile(d, 50), np.percentile(t, 50))
    p99 = (np.percentile(d, 99), np.percentile(t, 99))
    return {"sent": r["sent"], "p50": p50, "p99": p99, "add50": p50[1] - p50[0], "add99": p99[1] - p99[0],
            "cpu": cpu / max(len(t), 1) * 1000, "wait": wait / max(len(t), 1) * 1000, "lag": r["lag"],
            "load": os.getloadavg()[0]}


def row(rate: float, m: dict) -> str:
    return (f"{rate:5.0f} | {m['sent']:4d} "
            f"| {m['p50'][0]:6.2f} / {m['p50'][1]:6.2f} / {m['add50']:+6.2f} ms "
            f"| {m['p99'][0]:6.2f} / {m['p99'][1]:6.2f} / {m['add99']:+7.2f} ms "
            f"| {m['cpu']:5.2f} ms | {m['wait']:6.2f} ms | {m['lag']:.2f} s | {m['load']:.1f}")


HEADER = ("rate  | sent | TTFT p50 direct / routed / added | TTFT p99 direct / routed / added "
          "| router CPU/request | router wait for a CPU/request | client lag | load (1 min)")


def median(ms: list[dict]) -> dict:
    """Each column's median over the runs of one rate ("added" is the median of the differences)."""
    med = {k: float(np.median([m[k] for m in ms])) for k in ("add50", "add99", "cpu", "wait", "lag", "load")}
    med["sent"] = int(np.median([m["sent"] for m in ms]))
    med["p50"] = tuple(float(np.median([m["p50"][j] for m in ms])) for j in (0, 1))
    med["p99"] = tuple(float(np.median([m["p99"][j] for m in ms])) for j in (0, 1))
    return med


def write_json(path: str, meds: dict, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.pages import write_result

    rows = [[f"{rate:g}", m["sent"], f"{m['p50'][0]:.1f} / {m['p50'][1]:.1f} / {m['add50']:+.1f} ms",
             f"{m['p99'][0]:.1f} / {m['p99'][1]:.1f} / {m['add99']:+.1f} ms", f"{m['cpu']:.2f} ms",
             f"{m['wait']:.2f} ms", f"{m['load']:.1f}"] for rate, m in meds.items()]
    router = f"{args.picker} picker alone" if args.picker else args.config or "default scorers"
    write_result(path, ["rate (req/s)", "sent", "TTFT p50 direct / routed / added",
                        "TTFT p99 direct / routed / added", "router CPU per request",
                        "router wait for a CPU per request", "load (1 min)"], rows, notes=[
        f"{args.engines} emulated engines ({MODEL}) and the router ({router}) in their own processes, "
        f"{args.duration:g} s of Poisson arrivals per rate, each at random routed or direct; "
        f"{'median of ' + str(args.repeats) + ' interleaved runs' if args.repeats > 1 else 'one run'}; "
        f"{http_stack()}."])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[50, 200, 500])
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per rate")
    p.add_argument("--repeats", type=int, default=1, help="runs of every rate (interleaved); the summary "
                                                          "takes each column's median")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--picker", help="run the router with this picker alone (e.g. round-robin), not the "
                                    "default scorers")
    p.add_argument("--config", type=Path, help="run the router with this ROUTER.yaml instead")
    p.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = p.parse_args()
    procs = []
    try:
        engines = []
        for _ in range(args.engines):
            proc, url = spawn(["serve", "--emulate", MODEL, "--max-num-seqs", "256",
                               "--log-level", "warning"])
            procs.append(proc)
            engines.append(url)
        config = []
        if args.picker:
            path = Path(tempfile.mkdtemp()) / "router.yaml"
            path.write_text(f"kind: EndpointPickerConfig\nplugins:\n- type: {args.picker}-picker\n")
            config = ["--config", str(path)]
        elif args.config:
            config = ["--config", str(args.config)]
        rproc, router = spawn(["route", *sum((["--endpoint", u] for u in engines), []), *config])
        procs.append(rproc)
        print(f"{args.engines} emulated engines ({MODEL}), router pid {rproc.pid} "
              f"({args.picker + ' picker' if args.picker else args.config or 'default scorers'}); streaming, "
              f"4 output tokens; engines on uvicorn, router on its own server; {http_stack()}; "
              f"{os.cpu_count()} CPUs; "
              f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(HEADER)
        runs: dict[float, list[dict]] = {rate: [] for rate in args.rates}
        for i in range(args.repeats):
            for rate in args.rates:
                m = measure(router, engines, rproc, rate, args.duration, args.seed + i)
                runs[rate].append(m)
                print(row(rate, m), flush=True)
        meds = {rate: median(ms) for rate, ms in runs.items()}
        if args.repeats > 1:
            print(f"median of {args.repeats}:")
            print(HEADER)
            for rate, med in meds.items():
                print(row(rate, med))
        if args.json:
            write_json(args.json, meds, args)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
