"""Trigger values from an Observation, for callers without Prometheus (the simulator).

A trigger's query names a vLLM metric; its value is read from the Observation's fleet aggregates:
sum(...) of a gauge gives the fleet total, avg(...) (or no aggregation) the per-replica mean.
"""

from __future__ import annotations

from autoscaler.observation import Observation

# vLLM metric name -> (Observation field, is it already a per-replica mean?)
_GAUGES = {
    "num_requests_waiting": ("num_waiting", False),
    "num_requests_running": ("num_running", False),
    "kv_cache_usage_perc": ("kv_usage", True),
    "num_queue_reqs": ("num_waiting", False),  # SGLang
    "num_running_reqs": ("num_running", False),
    "token_usage": ("kv_usage", True),
}


def trigger_value(query: str, obs: Observation) -> float | None:
    """The value a Prometheus query would return, when it is a plain sum/avg of one known gauge."""
    q = query.replace(" ", "")
    replicas = max(obs.ready, 1)
    for metric, (field_name, is_mean) in _GAUGES.items():
        if metric in q:
            v = getattr(obs, field_name)
            if v is None:
                return None
            summed = q.startswith("sum(")
            if is_mean:
                return v * replicas if summed else v
            return v if summed else v / replicas
    if "request_success_total" in q or "rate(" in q:
        return obs.arrival_rate
    raise ValueError(f"trigger query {query!r}: no Observation field for it; fill obs.metrics instead")


def fill_trigger_metrics(policy_triggers, obs: Observation) -> Observation:
    """Set obs.metrics[name] for each trigger not already filled (triggers: objects with .name, .query)."""
    for t in policy_triggers:
        if t.name not in obs.metrics and t.name not in obs.errors:
            obs.metrics[t.name] = trigger_value(t.query, obs)
    return obs
