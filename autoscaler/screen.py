"""Screening an Observation before a policy sees it: a value no working source produces is a failed
read for this tick, never an exception out of a policy's arithmetic.

An LLM aggregate that is infinite, negative or beyond MAX_VALUE (what a Kubernetes milli-quantity
holds) is dropped and its name added to `errors` (so it is counted as a source error, and the step
holds or KEDA's fallback counts it); a NaN aggregate is an unknown value (None), as a source with no
data reports. A trigger's NaN and +-Inf keep KEDA's own rule (ignoreNullValues); a finite trigger
value beyond MAX_VALUE is a failed read of that trigger.
"""

from __future__ import annotations

import math

from autoscaler.observation import Observation

MAX_VALUE = 9.2e15  # int64 milli-units: the largest value a Kubernetes quantity (HPA's arithmetic) holds
AGGREGATES = ("arrival_rate", "mean_prompt_tokens", "mean_output_tokens", "num_waiting", "num_running",
              "kv_usage")


def screen(obs: Observation) -> list[str]:
    """Drops the out-of-range values of `obs` in place; returns the names now in obs.errors for that."""
    bad = []
    for name in AGGREGATES:
        v = getattr(obs, name)
        if v is None or 0.0 <= v <= MAX_VALUE:
            continue
        setattr(obs, name, None)
        if not math.isnan(v):
            obs.errors.add(name)
            bad.append(name)
    for name, v in obs.metrics.items():
        if v is not None and math.isfinite(v) and abs(v) > MAX_VALUE:
            obs.metrics[name] = None
            obs.errors.add(name)
            bad.append(name)
    return bad
