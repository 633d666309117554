"""The two searches, as generators free of simulation: each yields the next point to try and is sent
back whether a run there met every SLO; its return value is the answer. Tests drive them with
made-up verdicts; simulator.planner.stages drives them with simulated runs.

Capacity is searched on a geometric grid, rate_k = start * (1 + step)^k: first in jumps of about 2x
until a run passes and a run fails, then by bisection between the two indices until they are
neighbours. The answer is a rate that met every SLO whose next grid rate, (1 + step) times higher,
did not: tight to `step` by construction.
"""

from __future__ import annotations

import math
from collections.abc import Generator

Search = Generator[float, bool, tuple[float, float]]


def grid_rate(start: float, step: float, k: int) -> float:
    return start * (1.0 + step) ** k


def capacity_search(start: float, step: float, floor: float, ceiling: float) -> Search:
    """Yields rates (start within [floor, ceiling]); returns (highest rate that met, lowest rate above
    it that missed). (0, the lowest tried) when the lowest grid rate >= floor misses; (the highest
    tried, inf) when the highest grid rate <= ceiling meets."""
    jump = max(1, round(math.log(2.0) / math.log(1.0 + step)))  # indices per doubling
    k_min = math.ceil(math.log(floor / start) / math.log(1.0 + step) - 1e-9)
    k_max = math.floor(math.log(ceiling / start) / math.log(1.0 + step) + 1e-9)
    lo = hi = None
    k = 0
    while lo is None or hi is None:
        if (yield grid_rate(start, step, k)):
            lo = k
            if k == k_max:
                return grid_rate(start, step, k), math.inf
            k = min(k + jump, k_max)
        else:
            hi = k
            if k == k_min:
                return 0.0, grid_rate(start, step, k)
            k = max(k - jump, k_min)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (yield grid_rate(start, step, mid)):
            lo = mid
        else:
            hi = mid
    return grid_rate(start, step, lo), grid_rate(start, step, hi)


def fleet_search(start: int, max_replicas: int) -> Generator[int, bool, int | None]:
    """Yields replica counts from `start`, away from it until the verdict flips (down in steps of 1, 2,
    4, ...; up in steps of 1, 1, 2, 4, ...: a count that meets costs a run on every seed, one that misses
    usually one, so the search creeps up from below), then by bisection; returns the smallest count
    that met while one fewer missed (1 when one replica meets), or None when even max_replicas misses."""
    n = min(max(1, start), max_replicas)
    step = 1
    if (yield n):
        hi, lo = n, 0  # zero replicas never meet
        while hi - step >= 1:
            if not (yield hi - step):
                lo = hi - step
                break
            hi, step = hi - step, 2 * step
    else:
        lo, hi = n, None
        while hi is None:
            m = min(lo + step, max_replicas)
            if m == lo:
                return None
            if (yield m):
                hi = m
            else:
                lo, step = m, step if m - n < 2 else 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (yield mid):
            hi = mid
        else:
            lo = mid
    return hi


def lockstep(searches: list[Generator]) -> Generator[list, list[bool], list]:
    """Runs several searches side by side: yields the pending point of each unfinished one (None for
    the finished), is sent their verdicts in the same order, returns their answers."""
    answers: list = [None] * len(searches)
    points: list = [None] * len(searches)
    for i, s in enumerate(searches):
        points[i] = _advance(s, None, answers, i)
    while any(p is not None for p in points):
        verdicts = yield list(points)
        for i, s in enumerate(searches):
            if points[i] is not None:
                points[i] = _advance(s, verdicts[i], answers, i)
    return answers


def _advance(search: Generator, verdict, answers: list, i: int):
    try:
        return next(search) if verdict is None else search.send(verdict)
    except StopIteration as stop:
        answers[i] = stop.value
        return None
