"""Filters and scorers of the weighted (filter-score-pick) router, over plain replica state.

A scorer maps the candidate replicas to scores in [0, 1] (higher is better); `ctx` carries what the
request brings (its prefix match per replica, its session's last replica). A filter keeps replicas.
Each scorer is registered once (register_scorer: its scenario name, its EndpointPickerConfig plugin
type); the scenario schema, the live router's config and the weighted picker read the registry. The
pickers are registered the same way, beside them, in routing/pickers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Plugin:
    """A scorer or a picker, registered once: the scenario's name (router.weights key, router.policy),
    the EndpointPickerConfig plugin type that selects it live (None: none), its function, and whether
    it reads the prefix index or the session table (the router keeps them only when one is in use)."""

    name: str
    plugin_type: str | None
    fn: Callable
    uses_prefix: bool = False
    uses_session: bool = False


SCORERS: dict[str, Scorer] = {}  # name -> scorer (what the weighted picker calls)
SCORER_PLUGINS: dict[str, Plugin] = {}
# the scenario's router.weights schema (simulator.scenario_schema holds this object): one key a scorer
WEIGHTS_SCHEMA: dict = {"type": "object", "additionalProperties": False, "properties": {}}


def register_scorer(name: str, plugin_type: str | None, fn: Scorer, *, uses_prefix: bool = False,
                    uses_session: bool = False) -> Plugin:
    """Add a scorer: accepted in a scenario's router.weights and as an EndpointPickerConfig plugin."""
    if name in SCORER_PLUGINS:
        raise ValueError(f"scorer {name!r} is registered already")
    plugin = Plugin(name, plugin_type, fn, uses_prefix, uses_session)
    SCORER_PLUGINS[name], SCORERS[name] = plugin, fn
    WEIGHTS_SCHEMA["properties"][name] = {"type": "number", "minimum": 0}
    return plugin


def unregister_scorer(name: str) -> None:
    SCORER_PLUGINS.pop(name, None)
    SCORERS.pop(name, None)
    WEIGHTS_SCHEMA["properties"].pop(name, None)


register_scorer("queue", "queue-scorer", lambda reps, ctx: minmax_score([r.num_waiting for r in reps]))
register_scorer("load", "active-request-scorer",
                lambda reps, ctx: minmax_score([r.outstanding for r in reps]))
register_scorer("kv", "kv-cache-utilization-scorer", lambda reps, ctx: [1.0 - r.kv_usage for r in reps])
register_scorer("prefix", "prefix-cache-scorer", lambda reps, ctx: [ctx["match"](r) for r in reps],
                uses_prefix=True)
register_scorer("running", "running-requests-scorer",
                lambda reps, ctx: minmax_score([r.num_running for r in reps]))
register_scorer("session", "session-affinity-scorer",
                lambda reps, ctx: [1.0 if r.id == ctx.get("session") else 0.0 for r in reps],
                uses_session=True)


def routable(replicas: list) -> list:
    """Replicas that may take new requests: healthy and not draining (plain views have neither)."""
    return [r for r in replicas if getattr(r, "healthy", True) and not getattr(r, "draining", False)]


def below_thresholds(replicas: list, kv_threshold: float, queue_threshold: int) -> list[int]:
    """Indices of replicas under both thresholds (the weighted policy's saturation filter)."""
    return [i for i, r in enumerate(replicas)
            if r.kv_usage <= kv_threshold and r.num_waiting <= queue_threshold]
