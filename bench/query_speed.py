"""`slopilot query` on a million-sample recording, beside a real Prometheus holding the same samples.

Writes a recording shaped like a vLLM fleet's (--pods pods, each with 3 gauges, 3 counters and a
10-bucket TTFT histogram, a sample every 5 s; 1,000,000+ samples by default), backfills it into the
Debian Prometheus with promtool, then, in interleaved rounds, times each query three ways:

    cli     `python -m slopilot.cli query FILE Q ...` as a user runs it (process start included),
            reading the cache beside the file
    inproc  load_cached(FILE) + the query in this process (what the command does after start-up)
    prom    the same query through Prometheus' HTTP API

and the first, uncached call (the parse that writes the cache) once. Prints medians, the ratios to
Prometheus, and the load average before and after (the machine is shared: read the numbers with it).

    .venv/bin/python bench/query_speed.py [--pods 16] [--hours 4.83] [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.prometheus_server import PrometheusServer  # noqa: E402
from promql import instant_query, range_query  # noqa: E402
from promql.omcache import cache_path, load_cached  # noqa: E402
from promql.openmetrics import write_openmetrics  # noqa: E402

BUCKETS = ["0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "20.0", "+Inf"]
TTFT = "vllm:time_to_first_token_seconds_bucket"


def families(pods: int, n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    ts = list(range(0, 5000 * n, 5000))
    base = [("job", "vllm"), ("model_name", "llama2-70b")]

    def lb(name, pod, *extra):
        return tuple(sorted([("__name__", name), ("pod", f"decode-{pod}"), *base, *extra]))

    gauges, counters, hist = [], [], []
    for p in range(pods):
        load = np.clip(8 + 6 * np.sin(np.arange(n) / 300 + p) + rng.normal(0, 2, n), 0, None)
        gauges += [(lb("vllm:num_requests_running", p), ts, np.round(load).tolist()),
                   (lb("vllm:num_requests_waiting", p), ts, np.round(np.clip(load - 10, 0, None)).tolist()),
                   (lb("vllm:kv_cache_usage_perc", p), ts, np.clip(load / 20, 0, 1).tolist())]
        for name, scale in (("generation_tokens", 400), ("prompt_tokens", 2000), ("request_success", 3)):
            total = np.cumsum(rng.poisson(scale * load / 8)).astype(float)
            counters.append((lb(f"vllm:{name}_total", p), ts, total.tolist()))
        finished = np.cumsum(rng.poisson(load / 3 + 0.1, n))
        shares = np.cumsum(rng.dirichlet(np.ones(len(BUCKETS)), n), axis=1)
        for i, le in enumerate(BUCKETS):
            counts = np.floor(finished * np.minimum(shares[:, i], 1))
            hist.append((lb(TTFT, p, ("le", le)), ts, counts.tolist()))
        hist.append((lb("vllm:time_to_first_token_seconds_count", p), ts, finished.astype(float).tolist()))
        hist.append((lb("vllm:time_to_first_token_seconds_sum", p), ts, (finished * 0.7).tolist()))
    by_family: dict[str, list] = {}
    for s in gauges:
        by_family.setdefault((dict(s[0])["__name__"], "gauge"), []).append(s)
    for s in counters:
        by_family.setdefault((dict(s[0])["__name__"][:-6], "counter"), []).append(s)
    by_family[("vllm:time_to_first_token_seconds", "histogram")] = hist
    return [(name, kind, series) for (name, kind), series in by_family.items()]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=16)
    ap.add_argument("--hours", type=float, default=4.83)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (Debian package: prometheus)")
    print(f"load average before: {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="query-speed-"))
    rec = work / "rec.om"
    n = int(args.hours * 3600 / 5)
    with rec.open("w") as f:
        samples = write_openmetrics(f, families(args.pods, n))
    end_s = (n - 1) * 5
    print(f"recording: {samples:,} samples, {rec.stat().st_size / 1e6:.0f} MB, {end_s / 3600:.2f} h")
    started = time.monotonic()
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(rec),
                          str(work / "prom" / "data")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    print(f"promtool backfill: {time.monotonic() - started:.1f} s")
    instant = ["sum(vllm:num_requests_waiting)",
               f"histogram_quantile(0.9, sum by (le) (rate({TTFT}[1m])))"]
    ranged = [("sum(rate(vllm:generation_tokens_total[1m]))", 0, end_s, 60),
              (f"histogram_quantile(0.9, sum by (le) (rate({TTFT}[1m])))", end_s - 3600, end_s, 15)]
    cli = [sys.executable, "-m", "slopilot.cli", "query", str(rec)]
    cache_path(rec).unlink(missing_ok=True)
    started = time.monotonic()
    subprocess.run([*cli, instant[0], "--time", str(end_s)], cwd=ROOT, check=True, capture_output=True)
    first = time.monotonic() - started
    print(f"first call (parses, writes the cache): {first:.1f} s")
    server = PrometheusServer([], scrape_interval=60.0, data_dir=work / "prom").start()
    times: dict[tuple, list[float]] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(args.rounds):
                for q in instant:
                    cases = {"cli": [*cli, q, "--time", str(end_s)]}
                    _round(times, ("instant", q), cases, client, "/api/v1/query",
                           {"query": q, "time": end_s},
                           lambda store, q=q: instant_query(store, q, end_s * 1000), rec)
                for q, a, b, step in ranged:
                    cases = {"cli": [*cli, q, "--start", str(a), "--end", str(b), "--step", str(step)]}
                    _round(times, ("range", q), cases, client, "/api/v1/query_range",
                           {"query": q, "start": a, "end": b, "step": step},
                           lambda store, q=q, a=a, b=b, s=step: range_query(store, q, a * 1000, b * 1000,
                                                                              s * 1000), rec)
    finally:
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {args.rounds} interleaved rounds (ms); ratio = ours / Prometheus")
    print(f"{'kind':8} {'cli':>8} {'inproc':>8} {'prom':>8} {'cli/prom':>9} {'inproc/prom':>11}  query")
    rows = []
    for (kind, q) in dict.fromkeys(k[:2] for k in times):
        c, i, p = (median_ms(times[(kind, q, w)]) for w in ("cli", "inproc", "prom"))
        print(f"{kind:8} {c:8.1f} {i:8.1f} {p:8.2f} {c / p:9.0f} {i / p:11.0f}  {q[:70]}")
        span = {rq: f", {(b - a) / 3600:.2g} h every {st} s" for rq, a, b, st in ranged}.get(q, "")
        rows.append([f"{kind} `{q}`" + (span if kind == "range" else ""), round(c), round(i), round(p, 1)])
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        from bench.pages import write_result

        write_result(args.json, ["query", "CLI process (ms)", "load cache + answer, in process (ms)",
                                 "Prometheus HTTP (ms)"], rows, notes=[
            f"`slopilot query` on {samples:,} samples ({args.pods} vLLM-shaped pods, {end_s / 3600:.2f} h "
            f"at 5 s); medians of {args.rounds} interleaved rounds; the first, uncached call (parse, write "
            f"the cache) took {first:.1f} s. Prometheus {prom_version()} holds the same samples (promtool "
            "backfill)."])
    return 0


def prom_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    words = (out.stdout or out.stderr).split()
    return words[2] if len(words) > 2 else "?"


def _round(times, key, cases, client, path, params, inproc, rec) -> None:
    t0 = time.perf_counter()
    subprocess.run(cases["cli"], cwd=ROOT, check=True, capture_output=True)
    times.setdefault((*key, "cli"), []).append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    inproc(load_cached(rec))
    times.setdefault((*key, "inproc"), []).append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    r = client.get(path, params=params).json()
    times.setdefault((*key, "prom"), []).append(time.perf_counter() - t0)
    assert r["status"] == "success", r


if __name__ == "__main__":
    raise SystemExit(main())
