"""The P/D day's bounds (bench/pd_day.py; its setting from bench/pd_setup.py): the oracle's per-minute
plan and the reactive bounds.

* oracle bound: per minute, the fewest prefill and decode replicas for that minute's arrivals of each
  kind at the capacities a replica of each role sustains on each pure mix (steady runs of the planner's
  P:D search), each started and billed a startup delay ahead. Its GPU-hours are the "x oracle" unit.
* oracle plan (simulated): that plan, each pool on a schedule, through the same day.
* reactive bound (burst seen D s after its start): the same plan (foresight of the diurnal curve and of
  the length mix) blind to each burst until D s after it starts, keeping the level of the minute before
  it; then the burst's peak need ordered at once (perfect sizing), ready a startup delay later. A policy
  that sees a burst no earlier and sizes at the measured capacities has no more capacity in the burst's
  first minutes. D = 0 is the limit of any policy without foresight; D = 30 the earliest a 15-s scrape
  read by a 15-s poll can show it.
* reactive bound (seen at its start, 40 a pool ordered): as at D = 0, but ordering the most replicas
  a pool may have: what is late then is what the replicas already there leave late in the startup
  delay (engine queues do not migrate), which no capacity ordered at the burst's start can undo.
* the same + prefill x2: and twice the plan's prefill replicas standing outside the bursts (the
  prefill pool's standing capacity is what a burst's TTFT depends on).
* reactive bound (30 s) + standing headroom x h: outside the bursts ceil(h x the plan) per pool, the
  cost of absorbing a burst's first minutes with idle capacity instead of foresight (as
  bench/policies.py does for the aggregated bursty day).
* late bounds (bench/pd_day.py --late D..., --decode-headroom H...): seen D s after its start with 40 a
  pool ordered (the most any order seen then can do), and seen at the latest D, its peak ordered, with
  ceil(H x the plan) decode replicas standing outside the bursts (the prefill pool at the plan): what
  a policy whose burst test fires D s into a burst needs standing in its decode pool.
"""

from __future__ import annotations

import math

import numpy as np
import pd_setup as setup

from simulator.planner.oracle import MINUTE, plan_steps
from simulator.workload import Workload

ROLES = ("prefill", "decode")


def capacities(rate: float = 6.0) -> dict[str, tuple[float, float]]:
    """Per pure mix: (req/s one prefill replica sustains, req/s one decode replica sustains) within the
    SLOs, from the smallest P/D split meeting them in steady runs at `rate` (simulator.planner.pd_plan)."""
    from simulator.planner.pd_plan import level_task
    from simulator.planner.plan import load_plan
    from simulator.planner.sweep import SerialRunner, drive

    out = {}
    for name, ((pm, pmed, pmax), (om, omed, omax)) in setup.MIXES.items():
        pool = {k: v for k, v in setup.POOL.items() if k not in ("provisioning_delay", "cost_per_hour")}
        pool["kv_memory"] = {k: v for k, v in pool["kv_memory"].items() if k != "num_gpus"}
        plan = load_plan({
            "name": name, "seeds": [1], "duration": 600,
            "workload": {"arrivals": {"process": "gamma", "cv": 1.09, "rate": rate},
                         "prompt_tokens": {"dist": "lognormal", "mean": pm, "median": pmed, "max": pmax},
                         "output_tokens": {"dist": "lognormal", "mean": om, "median": omed, "max": omax}},
            "slo": setup.SLO, "router": {"policy": "least_outstanding"},
            "deployments": [{"name": "h100", **pool, "price_per_gpu_hour": 39.2 / setup.GPUS}],
            "search": {"duration": 600, "peak_duration": 600, "max_duration": 1200, "drain": 300},
            "pd": {k: v for k, v in setup.PD.items() if k not in ("prefill_pool", "decode_pool")}})
        lv = drive({"x": level_task(plan, rate, 1.0)}, SerialRunner())["x"]
        out[name] = (rate / lv["pd"]["prefill"], rate / lv["pd"]["decode"])
    return out


def lead_max(per_minute: np.ndarray) -> np.ndarray:
    """Each minute's count raised to the largest of the next startup delay's: started ahead."""
    lead = int(math.ceil(setup.STARTUP / MINUTE))
    return np.array([per_minute[k: k + lead + 1].max() for k in range(len(per_minute))])


def oracle_pd(wl: Workload, long: np.ndarray, day: float, caps: dict) -> dict:
    """Per minute the prefill and decode replicas that minute's arrivals of each kind need at the
    measured capacities (at least 1 each), started and billed a startup delay ahead."""
    minutes = int(math.ceil(day / MINUTE))
    m = (wl.times // MINUTE).astype(int)
    n_long = np.bincount(m[long], minlength=minutes)[:minutes] / MINUTE
    n_chat = np.bincount(m[~long], minlength=minutes)[:minutes] / MINUTE
    out, needs = {}, {}
    for i, role in enumerate(ROLES):
        work = n_long / caps["summarise"][i] + n_chat / caps["chat"][i]
        needs[role] = np.maximum(1, np.ceil(work - 1e-9)).astype(int)
        out[role] = lead_max(needs[role])
    ratio = out["prefill"] / out["decode"]
    return {"gpu_hours": float((out["prefill"] + out["decode"]).sum() / 60 * setup.GPUS),
            "pd_ratio": [float(ratio.min()), float(ratio.max())],
            "prefill_range": [int(out["prefill"].min()), int(out["prefill"].max())],
            "decode_range": [int(out["decode"].min()), int(out["decode"].max())],
            "need": {k: v.tolist() for k, v in needs.items()},
            "billed": {k: v.tolist() for k, v in out.items()}}


def spikes(day: float) -> list[dict]:
    return [{"at": day * f, "duration": 300} for f in setup.BURSTS]


def reactive_steps(need: np.ndarray, day: float, detect: float, headroom: float = 1.0,
                   order: int | None = None) -> list[dict]:
    """A pool's reactive bound: the oracle's per-minute plan, blind to each burst until `detect` s after
    its start, then the burst's peak need (or `order` replicas) ordered at once; outside the bursts
    ceil(headroom x plan)."""
    blind, extra = need.copy(), []
    for s in spikes(day):
        m0, m1 = int(s["at"] // 60), int(math.ceil((s["at"] + s["duration"]) / 60))
        blind[m0:m1] = need[m0 - 1]
        extra.append((s["at"] + detect, s["at"] + s["duration"], order or int(need[m0:m1].max())))
    return plan_steps(np.ceil(lead_max(blind) * headroom - 1e-9), extra)


def bound_plans(bound: dict, day: float, headrooms: list[float]) -> dict[str, dict[str, list[dict]]]:
    """name -> role -> schedule steps, for each simulated bound row."""
    need = {r: np.array(bound["need"][r]) for r in ROLES}
    plans = {"oracle plan (simulated)": {r: plan_steps(np.array(bound["billed"][r])) for r in ROLES},
             "reactive bound (burst seen at its start)": {
                 r: reactive_steps(need[r], day, 0.0) for r in ROLES},
             # what no capacity ordered at the burst's start can undo: it is ready 2 minutes later
             f"reactive bound (seen at its start, {setup.MAX_REPLICAS} a pool ordered)": {
                 r: reactive_steps(need[r], day, 0.0, order=setup.MAX_REPLICAS) for r in ROLES},
             "reactive bound (burst seen 30 s after its start)": {
                 r: reactive_steps(need[r], day, 30.0) for r in ROLES}}
    # the strongest no-foresight bound on TTFT at a given standing prefill pool: seen at its start, every
    # replica ordered, twice the plan's prefill replicas standing
    plans[f"reactive bound (seen at its start, {setup.MAX_REPLICAS} a pool ordered) + prefill x2"] = {
        "prefill": reactive_steps(need["prefill"], day, 0.0, 2.0, order=setup.MAX_REPLICAS),
        "decode": reactive_steps(need["decode"], day, 0.0, order=setup.MAX_REPLICAS)}
    for h in headrooms:
        plans[f"reactive bound (30 s) + standing headroom x{h:g}"] = {
            r: reactive_steps(need[r], day, 30.0, h) for r in ROLES}
    return plans


def late_plans(bound: dict, day: float, seen: list[float], decode_headrooms: list[float]) -> dict:
    """name -> role -> schedule steps, for the late bounds (seen D s after the burst's start)."""
    need = {r: np.array(bound["need"][r]) for r in ROLES}
    plans = {f"reactive bound (seen {d:g} s after its start, {setup.MAX_REPLICAS} a pool ordered)": {
        r: reactive_steps(need[r], day, d, order=setup.MAX_REPLICAS) for r in ROLES} for d in seen}
    for d in seen or [45.0]:
        for h in decode_headrooms:
            plans[f"reactive bound (seen {d:g} s after its start) + decode standing x{h:g}"] = {
                "prefill": reactive_steps(need["prefill"], day, d),
                "decode": reactive_steps(need["decode"], day, d, h)}
    return plans


def bound_rows(wl: Workload, day: float, bound: dict, headrooms: list[float], log=print,
               seed: int = 7, plans: dict | None = None) -> list[dict]:
    """The bound rows simulated (`plans`, default bound_plans'): each pool on its schedule, the same day."""
    rows = []
    for name, steps in (plans or bound_plans(bound, day, headrooms)).items():
        sched = {r: {"schedule": steps[r], "polling_interval": 5} for r in ROLES}
        sc = setup.scenario(day, sched["prefill"], sched["decode"], steps["prefill"][0]["replicas"],
                              steps["decode"][0]["replicas"], seed)
        rows.append(setup.run_row(name, sc, wl))
        log(rows[-1])
    return rows
