"""Where a light uniform load lands, without any HTTP: the simulator's router policies on two replicas
of the router-overhead bench's emulated model (its 33-token prompt, 4 output tokens, Poisson at 200
req/s). Prints TTFT p50/p99 per policy and its ratio to round robin's, over several seeds (medians).

    .venv/bin/python bench/router_placement.py [--rate 200] [--requests 4000] [--seeds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from simulator.run import simulate
from simulator.scenario import load_scenario
from simulator.workload import Workload

MODEL = "h100-llama2-70b-tp4"
POLICIES = ("round_robin", "random", "least_outstanding", "least_waiting")


def ttft_ms(policy: str, rate: float, n: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    sc = load_scenario({"seed": seed, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                        "router": {"policy": policy},
                        "pools": [{"name": "p", "latency_model": MODEL, "replicas": 2, "max_num_seqs": 256}]})
    wl = Workload(arrivals - arrivals[0], np.full(n, 33), np.full(n, 4))
    f = simulate(sc, workload=wl, plots=False).fleet
    ttft = (f.requests.first_token - f.arrival_ps) / 1e9
    return float(np.percentile(ttft, 50)), float(np.percentile(ttft, 99))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = p.parse_args()
    res = {pol: np.median([ttft_ms(pol, args.rate, args.requests, s) for s in range(args.seeds)], axis=0)
           for pol in POLICIES}
    base = res["round_robin"]
    print(f"{'policy':<18} {'TTFT p50 ms':>11} {'x rr':>6} {'TTFT p99 ms':>11} {'x rr':>6}")
    for pol, (p50, p99) in res.items():
        print(f"{pol:<18} {p50:>11.2f} {p50 / base[0]:>6.3f} {p99:>11.2f} {p99 / base[1]:>6.3f}")
    if args.json:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench.pages import write_result

        write_result(args.json, ["policy", "TTFT p50 ms", "x round robin", "TTFT p99 ms", "x round robin"],
                     [[pol, round(p50, 2), f"{p50 / base[0]:.3f}", round(p99, 2), f"{p99 / base[1]:.3f}"]
                      for pol, (p50, p99) in res.items()],
                     notes=[f"The simulator's router policies on 2 replicas of {MODEL} (max_num_seqs 256), "
                            f"{args.requests} requests of 33 prompt and 4 output tokens, Poisson at "
                            f"{args.rate:g} req/s, no HTTP; medians over {args.seeds} seeds. Deterministic: "
                            "independent of the machine's load."])


if __name__ == "__main__":
    main()
