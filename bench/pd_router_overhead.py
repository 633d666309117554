"""The router's added time on the P/D path: two hops through `slopilot route` vs the same two hops made
by the client itself, in the same run, interleaved, over loopback.

A prefill engine and a decode engine (`serve tiny` with --kv-transfer-config, real weights) and the
router (`route --endpoint DECODE --prefill-endpoint PREFILL --pd-threshold 0`) each in a process of
its own. Each round sends one fresh prompt (no prefix-cache hit anywhere) the direct way — POST to the
prefill engine with `max_tokens: 1` and `kv_transfer_params: {"do_remote_decode": true}`, then POST to
the decode engine with the answer's `kv_transfer_params` — and another fresh prompt through the router,
in random order. Prints each path's end-to-end p50/p90, the difference of the medians and the median
of the per-round differences, with the 1-minute load average.

    .venv/bin/python bench/pd_router_overhead.py [--rounds 60] [--prompt-tokens 256] [--max-tokens 4]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from router_overhead import spawn  # bench/ is on the path when a bench script runs


def role(r: str) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": "TcpConnector", "kv_role": r})]


def write_json(args: argparse.Namespace, times: dict, added: float, paired: float) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.pages import write_result

    rows = [[f"{name}: end-to-end p50 / p90 (n={len(ts)})",
             f"{np.median(ts) * 1e3:.2f} / {np.percentile(ts, 90) * 1e3:.2f} ms"]
            for name, ts in times.items()]
    rows += [["router added at p50 (difference of medians)", f"{added:+.2f} ms"],
             ["router added (median of the rounds' differences)", f"{paired:+.2f} ms"]]
    write_result(args.json, ["measure", "value"], rows, notes=[
        "`serve tiny` prefill and decode engines (TcpConnector) and `slopilot route` in processes of their "
        f"own; each of {args.rounds} rounds sends a fresh {args.prompt_tokens}-token prompt "
        f"({args.max_tokens} output tokens) both ways, in random order."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args()
    procs = []
    try:
        p, purl = spawn(["serve", "tiny", *role("kv_producer")], start_timeout=120)
        procs.append(p)
        d, durl = spawn(["serve", "tiny", *role("kv_consumer")], start_timeout=120)
        procs.append(d)
        r, rurl = spawn(["route", "--endpoint", durl, "--prefill-endpoint", purl, "--pd-threshold", "0"])
        procs.append(r)
        rng = random.Random(0)
        client = httpx.Client(timeout=60, trust_env=False)

        def body(**extra) -> dict:
            ids = [rng.randrange(3, 500) for _ in range(args.prompt_tokens)]
            return {"model": "tiny", "prompt": ids, "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True, **extra}

        def direct() -> float:
            b, t0 = body(), time.perf_counter()
            first = client.post(purl + "/v1/completions", json={**b, "max_tokens": 1, "kv_transfer_params":
                                                                {"do_remote_decode": True}}).json()
            out = client.post(durl + "/v1/completions", json={**b, "kv_transfer_params":
                                                              first["kv_transfer_params"]})
            assert out.status_code == 200, out.text
            return time.perf_counter() - t0

        def routed() -> float:
            b, t0 = body(), time.perf_counter()
            out = client.post(rurl + "/v1/completions", json=b)
            assert out.status_code == 200, out.text
            return time.perf_counter() - t0

        for _ in range(5):  # warm-up: connections, first steps
            direct(), routed()
        times: dict[str, list[float]] = {"direct": [], "routed": []}
        for _ in range(args.rounds):
            for name, fn in rng.sample([("direct", direct), ("routed", routed)], 2):
                times[name].append(fn())
        split = client.get(rurl + "/metrics").text
        assert 'slopilot_router_pd_decisions_total{decision="disaggregated"}' in split
        for name, ts in times.items():
            ms = np.array(ts) * 1e3
            print(f"{name:7s} p50 {np.median(ms):7.2f} ms  p90 {np.percentile(ms, 90):7.2f} ms (n={len(ms)})")
        added = (np.median(times["routed"]) - np.median(times["direct"])) * 1e3
        paired = np.median(np.array(times["routed"]) - np.array(times["direct"])) * 1e3
        print(f"router added at p50: {added:.2f} ms (difference of medians), {paired:.2f} ms (median of the "
              f"rounds' differences)   load average (1 min): {os.getloadavg()[0]:.1f}")
        if args.json:
            write_json(args, times, added, paired)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    main()
