"""The plan, run: stage 1 (capacity, simulator.planner.capacity) and the static fleet at the peak for
every candidate, then every policy over the whole curve on the chosen candidates; simulator.planner.rank
turns the answers into costs, a ranking and the answer.

The static fleet is the smallest replica count whose runs at the peak rate meet every SLO on every
seed, searched from ceil(peak / capacity) (simulator.planner.search.fleet_search), each run long enough
for its queue to be steady (simulator.planner.steady); the answer's is run again for longer before it
is given (simulator.planner.peakruns), and the plan re-ranked if that raises it. The oracle bound
of a candidate bills, per minute, that minute's arrivals over the static fleet's share of the peak per
replica, a startup delay ahead; the policies start from its first minute's count.
"""

from __future__ import annotations

import math

from simulator.dists import parse_dist
from simulator.planner.capacity import capacity_task
from simulator.planner.oracle import oracle
from simulator.planner.peakruns import (
    at_count,
    cheapest_per_deployment,
    fleet_verdict,
    peak_job,
    recheck,
    recheck_cheapest,
)
from simulator.planner.plan import Candidate, Plan
from simulator.planner.rank import assemble
from simulator.planner.scenarios import curve_scenario
from simulator.planner.search import fleet_search
from simulator.planner.steady import steady_runs
from simulator.planner.sweep import Job, drive
from simulator.planner.traffic import curve_peak, trace_peak


def run_plan(plan: Plan, runner, progress=None) -> dict:
    """Every simulation of the plan on `runner`; returns the plan's result (plan.json)."""
    by_len: dict = {}  # the workload differs between candidates only by their context window
    for c in plan.candidates:
        key = c.pool(1).get("max_model_len")
        by_len[key] = by_len.get(key) or day_workload(plan, c)
    days = {c.name: by_len[c.pool(1).get("max_model_len")] for c in plan.candidates}
    first = days[plan.candidates[0].name]
    if "trace" in plan.workload:
        peak = trace_peak(first.times)
    else:
        peak = curve_peak(plan.workload, plan.sim_duration)
    runs: dict[str, list] = {c.name: [] for c in plan.candidates}
    if progress is not None:
        progress.stage("capacity and static fleets")
    found = drive({c.name: candidate_task(plan, c, peak, runs[c.name]) for c in plan.candidates}, runner,
                  progress)
    if progress is not None:
        progress.stage("the cheapest static fleets re-checked at the peak")
    recheck_cheapest(plan, found, peak, runner, progress)
    startup = parse_dist(plan.startup_delay, "startup_delay").mean()
    oracles = {c.name: candidate_oracle(plan, c, found, days, peak, startup) for c in plan.candidates}
    tasks = {}
    for c in autoscaled_candidates(plan, found):
        first_replicas = int(oracles[c.name][1][0])
        for p in plan.policies:
            job = Job(curve_scenario(plan, c, p.autoscaler, first_replicas, p.name), plan.seeds[0])
            tasks[(c.name, p.name)] = single(job)
    if progress is not None:
        progress.stage("policies over the curve")
    curves = drive(tasks, runner, progress)
    result = assemble(plan, peak, days, found, runs, oracles, curves)
    rechecked = {n for n, f in found.items() if f["static"] and "searched_replicas" in f["static"]}
    while result["answer"]["met"] and result["answer"]["candidate"] not in rechecked:
        # the answer's static fleet, run longer before it is given; a count it raises re-ranks the plan
        name = result["answer"]["candidate"]
        if progress is not None:
            progress.stage(f"{name}: the answer re-checked at the peak")
        recheck(plan, found, peak, runner, [name], progress)
        rechecked.add(name)
        c = next(x for x in plan.candidates if x.name == name)
        oracles[name] = candidate_oracle(plan, c, found, days, peak, startup)
        result = assemble(plan, peak, days, found, runs, oracles, curves)
    return result


def candidate_oracle(plan: Plan, cand: Candidate, found: dict, days: dict, peak: float, startup: float):
    # a replica's share of the peak in the static fleet: pooled replicas serve more than one alone
    st = found[cand.name]["static"]
    if not (st and st["replicas"]):
        return None
    return oracle(days[cand.name].times, plan.sim_duration, peak / st["replicas"], startup)


def day_workload(plan: Plan, cand: Candidate):
    """The curve's requests (the first seed), as the candidate's pool would receive them."""
    from simulator.run import build_workload
    from simulator.scenario import load_scenario

    sc = load_scenario(curve_scenario(plan, cand, {"fixed": 1}, 1, "day"))
    return build_workload(sc, plan.seeds[0])


def candidate_task(plan: Plan, cand: Candidate, peak: float, runs: list):
    cap = yield from capacity_task(plan, cand, runs)
    # pooled replicas serve at least what the best seed's lone replica did: start the count there
    static = (yield from static_task(plan, cand, peak, cap["spread"]["max"])) if cap["rps"] > 0 else None
    return {"capacity": cap, "static": static}


def static_task(plan: Plan, cand: Candidate, peak: float, capacity: float):
    s = plan.search
    search = fleet_search(math.ceil(peak / capacity - 1e-9), s["max_replicas"])
    checked, at = [], {}
    n = next(search)
    while True:  # a count fails at its first seed that misses; a steady run's length is found per count
        duration, results, runs = yield from steady_runs(peak_job(plan, cand, n, peak), plan.seeds,
                                                         s["peak_duration"], s["max_duration"])
        ok, entry = fleet_verdict(plan, n, duration, results, runs)
        at[n] = (duration, results)
        checked.append(entry)
        try:
            n = search.send(ok)
        except StopIteration as stop:
            replicas = stop.value
            break
    if replicas is None:
        return {"replicas": None, "checked": checked}
    return {**at_count(replicas, *at[replicas]), "checked": sorted(checked, key=lambda c: c["replicas"])}


def autoscaled_candidates(plan: Plan, found: dict) -> list[Candidate]:
    """The candidates the policies run on: all that can meet the SLOs, or the cheapest static fleet of
    each deployment (ties: a re-checked one, then the first in the grid)."""
    ok = [c for c in plan.candidates if found[c.name]["static"] and found[c.name]["static"]["replicas"]]
    return ok if plan.autoscale == "all" else cheapest_per_deployment(plan, found)


def single(job: Job):
    results = yield [job]
    return results[0]["summary"]
