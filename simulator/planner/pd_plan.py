"""The P:D search: at each load level of the plan (fractions of its peak), the cheapest aggregated fleet
and the cheapest prefill/decode split that meet every SLO, side by side, with goodput per GPU.

A plan asks for it with a `pd` section (the scenario's pd section less the pool names, plus the load
levels and, optionally, a deployment per role; both default to the plan's first deployment):

    pd:
      threshold: 1024
      link: {bandwidth_gbs: 50, latency_ms: 0.5}
      levels: [0.25, 0.5, 0.75, 1.0]

Every verdict is a steady run at the level's constant rate (simulator.planner.steady: a warm-up third,
lengthened while its queue rises). Per level:

* aggregated: the smallest N (simulator.planner.search.fleet_search) from ceil(rate / capacity), the
  capacity a replica of the same deployment sustained in the previous level's answer (a first guess
  at the lowest level);
* P/D: the smallest P that meets with a decode pool as large as the aggregated answer (the prefill
  pool's need, the decode pool not binding), then the smallest D with that P, then the smallest D
  with P + 1 (a faster prefill leaves the decode pool more of the TTFT); the cheaper of the two.

Goodput per GPU is the run's goodput (requests within every SLO per second) over the fleet's GPUs.
"""

from __future__ import annotations

import math

from simulator.planner.plan import Candidate, Plan
from simulator.planner.scenarios import peak_scenario
from simulator.planner.search import fleet_search
from simulator.planner.steady import steady_runs, with_length
from simulator.planner.sweep import Job
from simulator.planner.verdict import meets

LEVELS = (0.25, 0.5, 0.75, 1.0)


def role_candidates(plan: Plan) -> tuple[Candidate, Candidate]:
    """(prefill, decode) candidates: the named deployments' first grid points."""
    pd = plan.pd or {}

    def pick(key: str) -> Candidate:
        name = pd.get(key)
        return next(c for c in plan.candidates if name is None or c.deployment.name == name)

    return pick("prefill_deployment"), pick("decode_deployment")


def check(plan: Plan) -> None:
    """The pd section as the simulator will read it (a fitted latency model needs kv_bytes_per_token)."""
    from simulator.scenario import load_scenario

    pre, dec = role_candidates(plan)
    try:
        load_scenario(pd_scenario(plan, pre, dec, 1, 1, 1.0, 60.0))
    except ValueError as exc:
        raise ValueError(f"plan {plan.name}: pd: as a scenario: {exc}") from None


def pd_scenario(plan: Plan, pre: Candidate, dec: Candidate, p: int, d: int, rate: float,
                duration: float) -> dict:
    """P prefill and D decode replicas at a constant rate, as one scenario with a pd section."""
    sc = peak_scenario(plan, pre, 1, rate, duration)
    pools = [{**pre.pool(p), "name": "prefill", "labels": {"engine": "prefill"}},
             {**dec.pool(d), "name": "decode", "labels": {"engine": "decode"}}]
    cfg = {k: v for k, v in plan.pd.items() if k in ("threshold", "link", "kv_bytes_per_token", "loads")}
    return with_length({**sc, "name": f"pd {p}P+{d}D", "pools": pools,
                        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", **cfg}}, duration)


def _verdict(plan: Plan, job_at):
    """A sweep sub-task: steady runs on every seed; returns (met, worst summary)."""
    s = plan.search
    duration, results, _ = yield from steady_runs(job_at, plan.seeds, s["peak_duration"], s["max_duration"])
    summaries = [r["summary"] for r in results]
    ok = len(summaries) == len(plan.seeds) and all(meets(x) for x in summaries)
    return ok, min(summaries, key=lambda x: x["slo_attainment_joint"] or 0.0)


def _smallest(plan: Plan, start: int, job_for, seen: dict):
    """The smallest count meeting the SLOs (fleet_search from start); seen: count -> (met, summary)."""
    search = fleet_search(start, plan.search["max_replicas"])
    n = next(search)
    while True:
        if n not in seen:
            seen[n] = yield from _verdict(plan, job_for(n))
        try:
            n = search.send(seen[n][0])
        except StopIteration as stop:
            return stop.value


def _entry(kind: str, counts: dict, summary: dict, gpus: int, cost_per_hour: float, rate: float) -> dict:
    good = summary.get("goodput_rps") or 0.0
    return {"kind": kind, **counts, "gpus": gpus, "cost_per_hour": cost_per_hour,
            "goodput_rps": good, "goodput_per_gpu": good / gpus if gpus else None,
            "attainment": summary["slo_attainment_joint"], "rate": rate,
            "slo": {k: v["value_at_percentile"] for k, v in summary["slo"].items()}}


def level_task(plan: Plan, rate: float, capacity_guess: float):
    """A sweep task: {aggregated, pd, ratio} at one constant rate (None entries where none met)."""
    pre, dec = role_candidates(plan)
    s = plan.search
    agg_seen: dict = {}

    def agg_job(n):
        return lambda seed, dur: Job(peak_scenario(plan, dec, n, rate, dur), seed, steady=True)

    start = max(1, math.ceil(rate / max(capacity_guess, 1e-9) - 1e-9))
    n = yield from _smallest(plan, start, agg_job, agg_seen)
    out: dict = {"rate": rate, "aggregated": None, "pd": None, "tried": {}}
    dep = dec.deployment
    if n is not None:
        out["aggregated"] = _entry("aggregated", {"replicas": n}, agg_seen[n][1], n * dep.gpus_per_replica,
                                   n * dep.cost_per_hour, rate)
    big = n or s["max_replicas"]
    pd_seen: dict = {}

    def pd_job(p, d):
        return lambda seed, dur: Job(pd_scenario(plan, pre, dec, p, d, rate, dur), seed, steady=True)

    def at(p):  # the runs of one P, keyed by D
        return pd_seen.setdefault(p, {})

    # the prefill pool's need: the smallest P with a decode pool that does not bind
    p_seen: dict = {}
    p_min = yield from _smallest(plan, max(1, big // 3), lambda p: pd_job(p, big), p_seen)
    for p, v in p_seen.items():
        at(p)[big] = v
    best = None
    for p in ([p_min, p_min + 1] if p_min is not None else []):
        if p > s["max_replicas"]:
            break
        d = yield from _smallest(plan, max(1, big - p), lambda d, p=p: pd_job(p, d), at(p))
        if d is None:
            continue
        gpus = p * pre.deployment.gpus_per_replica + d * dep.gpus_per_replica
        cost = p * pre.deployment.cost_per_hour + d * dep.cost_per_hour
        e = _entry("pd", {"prefill": p, "decode": d}, at(p)[d][1], gpus, cost, rate)
        if best is None or (cost, -e["goodput_rps"]) < (best["cost_per_hour"], -best["goodput_rps"]):
            best = e
    out["pd"] = best
    out["tried"] = {"aggregated": sorted(agg_seen), "pd": sorted([p, d] for p in pd_seen for d in pd_seen[p])}
    return out


def pd_plan_task(plan: Plan, peak: float, capacity_guess: float):
    """A sweep task: level_task at every level, lowest first, each one's aggregated capacity per
    replica the next one's first guess; returns the levels and the best of each kind at the peak."""
    levels, guess = [], capacity_guess
    for f in plan.pd.get("levels", LEVELS):
        lv = yield from level_task(plan, peak * f, guess)
        lv["level"] = f
        levels.append(lv)
        if lv["aggregated"]:
            guess = lv["rate"] / lv["aggregated"]["replicas"]
    return {"peak_rps": peak, "levels": levels}


def table(result: dict, currency: str) -> str:
    """The side-by-side table, one row per load level (markdown)."""
    rows = ["| load | req/s | aggregated | GPUs | goodput/GPU | cost/h | P/D best | GPUs | goodput/GPU "
            "| cost/h | P:D |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cells(e, name):
        if e is None:
            return ["none met", "-", "-", "-"]
        return [name, str(e["gpus"]), f"{e['goodput_per_gpu']:.3f}", f"{e['cost_per_hour']:.2f} {currency}"]

    for lv in result["levels"]:
        a, p = lv["aggregated"], lv["pd"]
        ratio = f"{p['prefill']}:{p['decode']}" if p else "-"
        split = f"{p['prefill']}P+{p['decode']}D" if p else ""
        cols = [f"{100 * lv['level']:.0f}%", f"{lv['rate']:.2f}", *cells(a, f"{a['replicas']}" if a else ""),
                *cells(p, split), ratio]
        rows.append("| " + " | ".join(cols) + " |")
    return "\n".join(rows)
