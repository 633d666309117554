"""Steady state: a run at a constant rate counts only once its queue has stopped growing.

A fleet started empty is optimistic at a high load: at 94% of its capacity a queue may take many
minutes to build up, and a 2-minute run meets SLOs the fleet misses for good after 10. So a run at the
peak (a) discards the first third of its arrivals (the scenario's `warmup`) and (b) is tested for
stationarity: its requests' waiting times, averaged in ten equal slices of the measured two thirds by
arrival time, must show no rising trend (Kendall's tau > 0 at p < 0.05 is a rise). A run that meets
its SLOs while still rising is run again twice as long, up to `max_duration`; a run that misses is a
miss at any length (the warm-up's bias only flatters), so it is never lengthened.

    duration, results, runs = yield from steady_runs(job_at, seeds, 180, 1800)
"""

from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau

from simulator.planner.verdict import meets

WARMUP_FRACTION = 1 / 3  # of a run's length, discarded before its SLOs are read
SLICES = 10  # batch means of the waiting time over the measured part
P_VALUE = 0.05


def with_length(scenario: dict, duration: float) -> dict:
    """The scenario run for `duration` seconds, its first third a warm-up."""
    return {**scenario, "duration": float(duration), "warmup": float(duration) * WARMUP_FRACTION}


def waiting_means(arrival: np.ndarray, queue: np.ndarray, start: float, end: float, sim_end: float,
                  slices: int = SLICES) -> list[float]:
    """Mean waiting time (arrival to first scheduled) of the requests arriving in each of `slices` equal
    parts of [start, end); a request never scheduled waited until the simulation ended."""
    wait = np.where(np.isnan(queue), sim_end - arrival, queue)
    edges = np.linspace(start, end, slices + 1)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        sel = (arrival >= a) & (arrival < b)
        out.append(float(wait[sel].mean()) if sel.any() else 0.0)
    return out


def rising(means: list[float]) -> dict:
    """Kendall's trend test on the slices' means: {rising, tau, p}."""
    if len(set(means)) < 2:
        return {"rising": False, "tau": 0.0, "p": 1.0}
    tau, p = kendalltau(np.arange(len(means)), means)
    return {"rising": bool(tau > 0 and p < P_VALUE), "tau": float(tau), "p": float(p)}


def stationarity(fleet) -> dict:
    """The trend of a finished run's waiting times after its warm-up: {stationary, tau, p, means}."""
    from simulator.report import request_table
    from simulator.steptime import PS

    req = request_table(fleet)
    sc = fleet.sc
    means = waiting_means(req["arrival"], req["queue"], sc.warmup, sc.duration, fleet.end_time_ps / PS)
    trend = rising(means)
    return {"stationary": not trend["rising"], "tau": trend["tau"], "p": trend["p"],
            "waiting_means": [round(m, 4) for m in means]}


def steady_runs(job_at, seeds: list[int], duration: float, max_duration: float):
    """A sweep task's part: runs every seed (in order, stopping at the first that misses) at `duration`,
    doubling it for all seeds while a run meets but its queue still rises (up to max_duration).
    Returns (the final duration, the results of the seeds run at it, how many runs in all).
    job_at(seed, duration) -> Job."""
    runs = 0
    while True:
        results, longer = [], False
        for seed in seeds:
            res = (yield [job_at(seed, duration)])[0]
            results.append(res)
            runs += 1
            if not meets(res["summary"]):
                return duration, results, runs
            if not res["steady"]["stationary"] and 2 * duration <= max_duration:
                longer = True
                break
        if not longer:
            return duration, results, runs
        duration *= 2
