"""Stage 1: the highest request rate one replica of a candidate sustains while meeting every SLO.

One capacity search per seed (simulator.planner.search), run side by side; the candidate's capacity
is the lowest of them, checked on every seed (a seed whose search passed above it but never ran at it
runs there; if it misses, the capacity steps down the grid until all seeds meet). The spread over
seeds is reported with every run's latency at its SLO percentiles (the capacity curves).
"""

from __future__ import annotations

import math

from simulator.planner.plan import Candidate, Plan
from simulator.planner.scenarios import MIN_RATE, capacity_scenario
from simulator.planner.search import capacity_search, grid_rate, lockstep
from simulator.planner.sweep import Job
from simulator.planner.verdict import meets
from simulator.scenario_limits import MAX_RATE


def capacity_task(plan: Plan, cand: Candidate, runs: list):
    """A sweep task (simulator.planner.sweep.drive): returns the capacity dict; appends every run to
    `runs` as [seed, rate, met, {slo: value at its percentile}, attainment]."""
    s = plan.search
    floor, step = MIN_RATE, s["step"]
    start = min(max(s["start_rate"], floor), MAX_RATE)
    seen: dict[tuple[int, float], bool] = {}

    def job(seed: int, rate: float) -> Job:
        return Job(capacity_scenario(plan, cand, rate), seed)

    def record(seed: int, rate: float, result: dict) -> bool:
        summary = result["summary"]
        ok = meets(summary)
        seen[(seed, rate)] = ok
        values = {k: v["value_at_percentile"] for k, v in summary["slo"].items()}
        runs.append([seed, rate, ok, values, summary["slo_attainment_joint"]])
        return ok

    lock = lockstep([capacity_search(start, step, floor, MAX_RATE) for _ in plan.seeds])
    try:
        points = next(lock)
        while True:
            todo = [(i, p) for i, p in enumerate(points) if p is not None]
            results = yield [job(plan.seeds[i], p) for i, p in todo]
            verdicts: list = [None] * len(points)
            for (i, p), res in zip(todo, results):
                verdicts[i] = record(plan.seeds[i], p, res)
            points = lock.send(verdicts)
    except StopIteration as stop:
        answers = stop.value
    per_seed = [{"seed": seed, "rps": met, "missed_rps": missed}
                for seed, (met, missed) in zip(plan.seeds, answers)]
    rate = min(a[0] for a in answers)
    while rate > 0:  # every seed must meet at the capacity
        todo = [seed for seed in plan.seeds if (seed, rate) not in seen]
        results = yield [job(seed, rate) for seed in todo]
        for seed, res in zip(todo, results):
            record(seed, rate, res)
        if all(seen[(seed, rate)] for seed in plan.seeds):
            break
        k = round(math.log(rate / start) / math.log(1.0 + step)) - 1
        rate = grid_rate(start, step, k)
        rate = 0.0 if rate < floor else rate
    rates = [p["rps"] for p in per_seed]
    above = grid_rate(start, step, round(math.log(rate / start) / math.log(1.0 + step)) + 1) if rate else None
    return {
        "rps": rate,
        # the next rate of the grid, (1 + step) times higher, and the seeds whose run there missed
        "next_rps": above,
        "next_missed_by": [seed for seed in plan.seeds if seen.get((seed, above)) is False],
        "per_seed": per_seed,
        "spread": {"min": min(rates), "max": max(rates),
                   "relative": (max(rates) - min(rates)) / max(rates) if max(rates) > 0 else None},
    }
