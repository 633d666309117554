"""The fewest replicas that meet a scenario's SLOs on its own workload, replayed as given.

The planner's capacity runs resample a trace's rows at a constant rate, which keeps its length mix
but not who talks to whom when: a conversation's turns no longer follow each other, so what a
prefix cache (and an offload tier behind it) wins is not the trace's. Here the scenario's workload
runs unchanged (a trace keeps its times and shared prefixes) on a static pool of N replicas, and N is
searched: doubled from `start` until the SLOs are met, then bisected (SLO attainment is taken as
monotone in N). Each variant is a function of the scenario dict (e.g. without its offload tier).

    fewest_replicas(scenario_dict, start=8)  # -> {"replicas": 11, "runs": {8: summary, 16: ..., ...}}
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

MAX_REPLICAS = 512


def with_replicas(scenario: dict, n: int) -> dict:
    """The scenario's first pool fixed at n replicas (its autoscaler replaced)."""
    sc = copy.deepcopy(scenario)
    pool = sc["pools"][0]
    pool["replicas"] = n
    pool["autoscaler"] = {"fixed": n}
    return sc


def meets(summary: dict) -> bool:
    slo = summary["slo"]
    return bool(slo) and all(v["met"] for v in slo.values())


def fewest_replicas(scenario: dict, start: int = 8, base_dir: Path | None = None, seed: int | None = None,
                    limit: int = MAX_REPLICAS, log: Callable[[str], None] | None = None) -> dict:
    """{"replicas": the fewest N meeting every SLO (None: not even `limit`), "runs": {N: summary}}."""
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    runs: dict[int, dict] = {}

    def ok(n: int) -> bool:
        if n not in runs:
            sc = load_scenario(with_replicas(scenario, n), base_dir=base_dir)
            res = simulate(sc, seed=seed, plots=False)
            runs[n] = res.summary
            if log:
                s = res.summary
                slo = ", ".join(f"{k} p{v['percentile']:g} {v['value_at_percentile']:.3g} s"
                                for k, v in s["slo"].items() if v["value_at_percentile"] is not None)
                log(f"  {n} replicas: {'meets' if meets(s) else 'misses'} ({slo})")
        return meets(runs[n])

    lo, hi = 0, max(1, min(start, limit))  # lo misses (0: none tried), hi is the next to try
    while not ok(hi):
        lo = hi
        if hi >= limit:
            return {"replicas": None, "runs": runs}
        hi = min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return {"replicas": hi, "runs": runs}
