"""Filters and scorers of the weighted (filter-score-pick) router, over plain replica state.

A scorer maps the candidate replicas to scores in [0, 1] (higher is better); `ctx` carries what the
request brings (its prefix match per replica, its session's last replica). A filter keeps replicas.
"""

from __future__ import annotations

from typing import Callable, Protocol


class ReplicaView(Protocol):
    id: int
    num_waiting: int  # requests queued in the engine
    num_running: int  # requests in the running batch
    outstanding: int  # requests routed to it and not finished yet
    kv_usage: float  # 0..1


def minmax_score(values: list[float]) -> list[float]:
    """1 for the lowest value, 0 for the highest (llm-d's queue and load scorers)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


Scorer = Callable[[list, dict], list[float]]

SCORERS: dict[str, Scorer] = {
    "queue": lambda reps, ctx: minmax_score([r.num_waiting for r in reps]),
    "load": lambda reps, ctx: minmax_score([r.outstanding for r in reps]),
    "kv": lambda reps, ctx: [1.0 - r.kv_usage for r in reps],
    "prefix": lambda reps, ctx: [ctx["match"](r) for r in reps],
    "running": lambda reps, ctx: minmax_score([r.num_running for r in reps]),
    "session": lambda reps, ctx: [1.0 if r.id == ctx.get("session") else 0.0 for r in reps],
}


def routable(replicas: list) -> list:
    """Replicas that may take new requests: healthy and not draining (plain views have neither)."""
    return [r for r in replicas if getattr(r, "healthy", True) and not getattr(r, "draining", False)]


def below_thresholds(replicas: list, kv_threshold: float, queue_threshold: int) -> list[int]:
    """Indices of replicas under both thresholds (the weighted policy's saturation filter)."""
    return [i for i, r in enumerate(replicas)
            if r.kv_usage <= kv_threshold and r.num_waiting <= queue_threshold]
