"""The scenarios a plan runs, as scenario dicts (the YAML a user could pass to `slopilot simulate`):

    capacity   one replica at a constant rate (stage 1)
    peak       N replicas at the curve's peak rate (stage 2, static fleet)
    curve      the whole (compressed) curve under a policy (stage 2, autoscaled)

Capacity and peak runs share the plan's arrival process and length mix, last `search.duration`
seconds (a capacity run at a low rate longer, to hold MIN_REQUESTS; a peak run `search.peak_duration`
or longer, until its queue is steady: simulator.planner.steady, whose warm-up third it discards) and
drain for at most `search.drain`; replicas are ready from the start. Curve runs start replicas after
the plan's startup delay.
"""

from __future__ import annotations

from simulator.planner.plan import Candidate, Plan
from simulator.planner.steady import with_length
from simulator.planner.traffic import constant_workload

MIN_REQUESTS = 200  # expected requests in a capacity run: enough to read a p90 from
MIN_RATE = 0.01  # req/s: a replica that cannot meet the SLOs at this rate is taken as never meeting them


def _base(plan: Plan, name: str, pool: dict, workload: dict, duration: float) -> dict:
    return {
        "name": name,
        "seed": plan.seeds[0],
        "duration": duration,
        "workload": workload,
        "pools": [pool],
        "router": plan.router,
        "slo": plan.slo,
        "currency": plan.currency,
        "drain": {"max": plan.search["drain"]},
    }


def capacity_scenario(plan: Plan, cand: Candidate, rate: float) -> dict:
    wl = constant_workload(plan.workload, rate)
    duration = max(plan.search["duration"], MIN_REQUESTS / rate)
    return _base(plan, f"{cand.name} capacity", cand.pool(1), wl, duration)


def peak_scenario(plan: Plan, cand: Candidate, replicas: int, peak_rate: float,
                  duration: float | None = None) -> dict:
    """N replicas at the peak for `duration` (default search.peak_duration), its first third a warm-up."""
    wl = constant_workload(plan.workload, peak_rate)
    sc = _base(plan, f"{cand.name} peak", cand.pool(replicas), wl, plan.search["peak_duration"])
    return with_length(sc, duration or plan.search["peak_duration"])


def curve_scenario(plan: Plan, cand: Candidate, autoscaler: dict, replicas: int, name: str) -> dict:
    """The curve under `autoscaler` (a scenario autoscaler entry), starting from `replicas`."""
    pool = {**cand.pool(replicas), "provisioning_delay": plan.startup_delay, "autoscaler": autoscaler}
    return _base(plan, f"{cand.name} {name}", pool, plan.workload, plan.sim_duration)
