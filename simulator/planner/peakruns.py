"""Runs of a static fleet at the peak, and the re-check of the answer before it is given.

The fleet search (simulator.planner.stages) judges each replica count on steady runs of
`search.peak_duration` seconds or longer (simulator.planner.steady). Those are still short: a fleet near
its capacity can meet for minutes and then fall into a queue it does not leave. So before the policies
run, each deployment's cheapest static fleet is run again at the peak for `search.check_duration`
seconds (15 minutes by default) on every seed; while it misses, one more replica is tried; if that
makes another engine setting the cheapest, that one is re-checked too. The answer is always a
re-checked fleet (simulator.planner.stages checks it once more after ranking).
"""

from __future__ import annotations

from simulator.planner.plan import Candidate, Plan
from simulator.planner.scenarios import peak_scenario
from simulator.planner.steady import steady_runs
from simulator.planner.sweep import Job, drive
from simulator.planner.verdict import meets


def peak_job(plan: Plan, cand: Candidate, replicas: int, peak: float):
    """job_at(seed, duration) for simulator.planner.steady.steady_runs: `replicas` at the peak."""
    return lambda seed, duration: Job(peak_scenario(plan, cand, replicas, peak, duration), seed, steady=True)


def fleet_verdict(plan: Plan, n: int, duration: float, results: list, runs: int) -> tuple[bool, dict]:
    """Did `n` replicas meet on every seed, and the record of it for plan.json."""
    summaries = [r["summary"] for r in results]
    ok = len(summaries) == len(plan.seeds) and all(meets(x) for x in summaries)
    return ok, {"replicas": n, "met": ok, "attainment": min(x["slo_attainment_joint"] for x in summaries),
                "seeds_run": len(summaries), "simulations": runs, "duration": duration,
                "stationary": all(r["steady"]["stationary"] for r in results),
                "slo": worst_slo(summaries)}


def worst_slo(summaries: list[dict]) -> dict:
    """Each SLO's value at its percentile, the worst over the runs (None: nothing finished)."""
    out = {}
    for name in summaries[0]["slo"]:
        values = [x["slo"][name]["value_at_percentile"] for x in summaries]
        out[name] = None if None in values else max(values)
    return out


def at_count(replicas: int, duration: float, results: list) -> dict:
    """The static fleet's entry at its answer: attainment (worst seed), throughput, each SLO's worst value
    at its percentile and the replicas' busy fraction (worst seed), the length of the runs."""
    summaries = [r["summary"] for r in results]
    return {
        "replicas": replicas,
        "attainment_at_peak": min(x["slo_attainment_joint"] for x in summaries),
        "output_tokens_per_s_at_peak": summaries[0]["output_tokens_per_s"],
        "duration": duration,
        "slo_at_peak": worst_slo(summaries),
        "busy_at_peak": max(p["utilization"] or 0.0 for x in summaries for p in x["pools"].values()),
    }


def recheck_task(plan: Plan, cand: Candidate, peak: float, replicas: int):
    """A sweep task: the static fleet at the peak for check_duration on every seed, one more replica
    while it misses; returns at_count's entry with the runs made (None replicas: none up to the max)."""
    s = plan.search
    entries, n = [], replicas
    while n <= s["max_replicas"]:
        duration, results, runs = yield from steady_runs(
            peak_job(plan, cand, n, peak), plan.seeds, s["check_duration"],
            max(s["max_duration"], s["check_duration"]))
        ok, entry = fleet_verdict(plan, n, duration, results, runs)
        entries.append({**entry, "recheck": True})
        if ok:
            return {**at_count(n, duration, results), "entries": entries}
        n += 1
    return {"replicas": None, "entries": entries}


def recheck(plan: Plan, found: dict, peak: float, runner, names: list[str], progress=None) -> None:
    """Re-checks these candidates' static fleets, in place (found[name]["static"])."""
    todo = [c for c in plan.candidates if c.name in names and found[c.name]["static"]
            and found[c.name]["static"]["replicas"]]
    tasks = {c.name: recheck_task(plan, c, peak, found[c.name]["static"]["replicas"]) for c in todo}
    for name, answer in drive(tasks, runner, progress).items():
        found[name]["static"] = merged(found[name]["static"], answer)


def cheapest_per_deployment(plan: Plan, found: dict) -> list[Candidate]:
    """Each deployment's candidate with the fewest static replicas (ties: a re-checked one, then the
    first in the plan's grid), in the plan's order."""
    best: dict[str, tuple] = {}
    for i, c in enumerate(plan.candidates):
        st = found[c.name]["static"]
        if st and st["replicas"]:
            key = (st["replicas"], "searched_replicas" not in st, i)
            if c.deployment.name not in best or key < best[c.deployment.name][0]:
                best[c.deployment.name] = (key, c)
    return [c for c in plan.candidates if any(c is b for _, b in best.values())]


def recheck_cheapest(plan: Plan, found: dict, peak: float, runner, progress=None) -> None:
    """Re-checks each deployment's cheapest static fleet (every candidate's with autoscale: all) until
    the cheapest of each has been re-checked: a re-check that raises a count may hand the place on."""
    while True:
        pool = plan.candidates if plan.autoscale == "all" else cheapest_per_deployment(plan, found)
        todo = [c.name for c in pool if found[c.name]["static"] and found[c.name]["static"]["replicas"]
                and "searched_replicas" not in found[c.name]["static"]]
        if not todo:
            return
        recheck(plan, found, peak, runner, todo, progress)


def merged(static: dict, answer: dict) -> dict:
    """The search's static entry with the re-check's answer: its count, its runs among the checked and
    what held the count down (the largest count that missed: in the search or the re-check)."""
    checked = sorted(static["checked"] + answer["entries"],
                     key=lambda c: (c["replicas"], c.get("recheck", False)))
    out = {**static, **{k: v for k, v in answer.items() if k != "entries"}, "checked": checked,
           "searched_replicas": static["replicas"], "recheck_duration": answer["entries"][-1]["duration"]}
    if answer["replicas"] is None:
        return {"replicas": None, "checked": checked, "searched_replicas": static["replicas"]}
    below = [c for c in checked if c["replicas"] == answer["replicas"] - 1 and not c["met"]]
    out["fewer_missed"] = max(below, key=lambda c: c["duration"]) if below else None
    return out
