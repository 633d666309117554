"""What a run cost: each replica is paid from its creation (provisioning included) until it is gone,
at its pool's cost_per_hour, split at the end of the workload into the cost of serving it and the cost
of the drain after it (the requests still running when arrivals stop).
"""

from __future__ import annotations

from simulator.steptime import PS

HOUR = 3600.0


def lifetimes(pool, run_end_ps: int) -> list[tuple[int, int]]:
    """(created, gone) of every replica the pool ever had, in picoseconds."""
    return [(r.created, r.gone_at if r.gone_at is not None else run_end_ps) for r in pool.replicas]


def seconds_within(spans: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Replica-seconds of the spans inside [lo, hi)."""
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans) / PS


def peak(spans: list[tuple[int, int, float]]) -> float:
    """The largest sum of weights alive at one time (spans: start, stop, weight)."""
    events = sorted([(a, w) for a, b, w in spans if b > a] + [(b, -w) for a, b, w in spans if b > a],
                    key=lambda e: (e[0], e[1]))  # at one instant, replicas leave before others come
    best = now = 0.0
    for _, w in events:
        now += w
        best = max(best, now)
    return best


def gpus_per_replica(pool) -> int:
    """GPUs one replica holds: the pool's kv_memory num_gpus, or its latency model's tensor parallelism."""
    km = pool.spec.kv_memory or {}
    return max(int(km.get("num_gpus", 1)), int(getattr(pool.model, "tp", 1) or 1))


def pool_cost(pool, workload_end_ps: int, run_end_ps: int) -> dict:
    spans = lifetimes(pool, run_end_ps)
    price, gpus = pool.spec.cost_per_hour, gpus_per_replica(pool)
    total = seconds_within(spans, 0, run_end_ps) / HOUR
    serving = seconds_within(spans, 0, workload_end_ps) / HOUR
    top = int(peak([(a, b, 1.0) for a, b in spans]))
    return {
        "gpus_per_replica": gpus,
        "gpu_hours": total * gpus,
        "peak_replicas": top,
        "cost_per_hour_at_peak": top * price,
        "cost_during_workload": serving * price,
        "cost_drain": (total - serving) * price,
    }


def fleet_cost(pools: list, pool_costs: dict, workload_end_ps: int, run_end_ps: int, currency: str,
               output_tokens: float) -> dict:
    """The fleet's totals; pool_costs: pool name -> pool_cost(...) plus its "cost"."""
    spans = [(a, b, p.spec.cost_per_hour) for p in pools for a, b in lifetimes(p, run_end_ps)]
    total = sum(c["cost"] for c in pool_costs.values())
    return {
        "currency": currency,
        "total": total,
        "during_workload": sum(c["cost_during_workload"] for c in pool_costs.values()),
        "drain": sum(c["cost_drain"] for c in pool_costs.values()),
        "drain_seconds": max(0, run_end_ps - workload_end_ps) / PS,
        "per_hour_at_peak": peak(spans),
        "gpu_hours": sum(c["gpu_hours"] for c in pool_costs.values()),
        "per_million_output_tokens": total / output_tokens * 1e6 if output_tokens > 0 else None,
    }
