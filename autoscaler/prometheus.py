"""KEDA's Prometheus trigger semantics on a query result (pure: the HTTP call lives in controlplane).

Follows kedacore/keda pkg/scalers/prometheus_scaler.go (ExecutePromQuery): an empty result, a sample
without a value, NaN or +-Inf become 0 when ignoreNullValues (the default) and an error otherwise;
more than one series, or a non-2xx response, is always an error.
"""

from __future__ import annotations

import math


class QueryError(Exception):
    """The trigger's query failed: KEDA counts it towards the fallback's failureThreshold."""


def null_value(value: float | None, ignore_null_values: bool) -> float:
    """The value KEDA uses for one scalar result (None = empty result)."""
    if value is None or math.isnan(value) or math.isinf(value):
        if ignore_null_values:
            return 0.0
        raise QueryError(f"prometheus query returned {value!r} and ignoreNullValues is false")
    return float(value)


def value_from_response(body: dict, status: int = 200, ignore_null_values: bool = True) -> float:
    """The value of a Prometheus /api/v1/query JSON response, as the KEDA trigger reads it."""
    if not 200 <= status < 300:
        raise QueryError(f"prometheus query api returned error. status: {status}")
    results = (body.get("data") or {}).get("result") or []
    if len(results) == 0:
        return null_value(None, ignore_null_values)
    if len(results) > 1:
        raise QueryError(f"prometheus query returned multiple elements ({len(results)})")
    sample = results[0].get("value") or []
    if len(sample) == 0:
        return null_value(None, ignore_null_values)
    if len(sample) < 2:
        raise QueryError("prometheus query didn't return enough values")
    try:
        value = float(sample[1])
    except (TypeError, ValueError) as exc:
        raise QueryError(f"prometheus query returned a non-number {sample[1]!r}") from exc
    return null_value(value, ignore_null_values)
