"""The oracle lower bound: with perfect foresight of each minute's arrivals and a measured capacity per
replica, the fewest replicas each minute needs, each started (and billed) a startup delay ahead. No
policy that sizes replicas for that capacity can serve the workload for less.

    need, billed = oracle(workload.times, duration, capacity, startup=120)
    replica_hours = billed.sum() / 60
"""

from __future__ import annotations

import math

import numpy as np

MINUTE = 60.0


def oracle(times: np.ndarray, duration: float, capacity: float,
           startup: float) -> tuple[np.ndarray, np.ndarray]:
    """Per minute: replicas needed (that minute's arrivals / capacity, at least 1) and replicas billed
    (a replica needed at minute m is started, and billed, from the minute `startup` seconds before)."""
    if capacity <= 0:
        raise ValueError("the oracle needs a capacity per replica > 0")
    minutes = int(math.ceil(duration / MINUTE))
    counts = np.bincount((np.asarray(times) // MINUTE).astype(int), minlength=minutes)[:minutes]
    need = np.maximum(1, np.ceil(counts / MINUTE / capacity)).astype(int)
    lead = int(math.ceil(startup / MINUTE))
    billed = np.array([need[m : m + lead + 1].max() for m in range(minutes)])
    return need, billed


def plan_steps(per_minute, extra: list[tuple[float, float, int]] = ()) -> list[dict]:
    """A schedule autoscaler's steps: per_minute[m] replicas from minute m, raised to n on each
    [start, end) of `extra` (times in seconds)."""
    edges = sorted({MINUTE * m for m in range(len(per_minute))} | {t for a, b, _ in extra for t in (a, b)})
    steps, last = [], None
    for t in edges:
        m = min(int(t // MINUTE), len(per_minute) - 1)
        n = max([int(per_minute[m])] + [k for a, b, k in extra if a <= t < b])
        if n != last:
            steps.append({"at": t, "replicas": n})
            last = n
    return steps
