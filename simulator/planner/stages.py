"""The plan, run: stage 1 (capacity, simulator.planner.capacity) and the static fleet at the peak for
every candidate, then every policy over the whole curve on the chosen candidates; simulator.planner.rank
turns the answers into costs, a ranking and the answer.

The static fleet is the smallest replica count whose runs at the peak rate meet every SLO on every
seed, searched from ceil(peak / capacity) (simulator.planner.search.fleet_search). The oracle bound
of a candidate bills, per minute, that minute's arrivals over the static fleet's share of the peak per
replica, a startup delay ahead; the policies start from its first minute's count.
"""

from __future__ import annotations

import math

from simulator.dists import parse_dist
from simulator.planner.capacity import capacity_task
from simulator.planner.oracle import oracle
from simulator.planner.plan import Candidate, Plan
from simulator.planner.rank import assemble
from simulator.planner.scenarios import curve_scenario, peak_scenario
from simulator.planner.search import fleet_search
from simulator.planner.sweep import Job, drive
from simulator.planner.traffic import curve_peak, trace_peak
from simulator.planner.verdict import meets


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
    startup = parse_dist(plan.startup_delay, "startup_delay").mean()
    oracles = {}
    for c in plan.candidates:
        # a replica's share of the peak in the static fleet: pooled replicas serve more than one alone
        st = found[c.name]["static"]
        fleet_cap = peak / st["replicas"] if st and st["replicas"] else 0.0
        oracles[c.name] = None
        if fleet_cap:
            oracles[c.name] = oracle(days[c.name].times, plan.sim_duration, fleet_cap, startup)
    tasks = {}
    for c in autoscaled_candidates(plan, found):
        first_replicas = int(oracles[c.name][1][0])
        for p in plan.policies:
            job = Job(curve_scenario(plan, c, p.autoscaler, first_replicas, p.name), plan.seeds[0])
            tasks[(c.name, p.name)] = single(job)
    if progress is not None:
        progress.stage("policies over the curve")
    curves = drive(tasks, runner, progress)
    return assemble(plan, peak, days, found, runs, oracles, curves)


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
    search = fleet_search(math.ceil(peak / capacity - 1e-9), plan.search["max_replicas"])
    checked, at = [], {}
    n = next(search)
    while True:
        summaries = []
        for seed in plan.seeds:  # a count fails at its first seed that misses
            results = yield [Job(peak_scenario(plan, cand, n, peak), seed)]
            summaries.append(results[0]["summary"])
            if not meets(summaries[-1]):
                break
        ok = all(meets(s) for s in summaries)
        at[n] = summaries
        worst = min(s["slo_attainment_joint"] for s in summaries)
        checked.append({"replicas": n, "met": ok, "attainment": worst, "seeds_run": len(summaries)})
        try:
            n = search.send(ok)
        except StopIteration as stop:
            replicas = stop.value
            break
    if replicas is None:
        return {"replicas": None, "checked": checked}
    return {
        "replicas": replicas,
        "attainment_at_peak": min(s["slo_attainment_joint"] for s in at[replicas]),
        "output_tokens_per_s_at_peak": at[replicas][0]["output_tokens_per_s"],
        "checked": sorted(checked, key=lambda c: c["replicas"]),
    }


def autoscaled_candidates(plan: Plan, found: dict) -> list[Candidate]:
    """The candidates the policies run on: all that can meet the SLOs, or the cheapest static fleet of
    each deployment (ties: the first in the grid)."""
    ok = [c for c in plan.candidates if found[c.name]["static"] and found[c.name]["static"]["replicas"]]
    if plan.autoscale == "all":
        return ok
    def cost(c: Candidate) -> float:
        return found[c.name]["static"]["replicas"] * c.deployment.cost_per_hour

    best: dict[str, Candidate] = {}
    for c in ok:
        d = c.deployment.name
        if d not in best or cost(c) < cost(best[d]):
            best[d] = c
    return [c for c in ok if best.get(c.deployment.name) is c]


def single(job: Job):
    results = yield [job]
    return results[0]["summary"]
