"""One group of an aggregation (sum, avg, min, max, count, group, stddev, stdvar, quantile)."""

from __future__ import annotations

import math

from promql import functions as fn
from promql.parse import PromQLError


def reduce(op: str, vs: list[float], param: float | None) -> float:
    """One group of an aggregation, in Prometheus' order of operations."""
    first = vs[0]
    if op == "sum":
        total = first
        for v in vs[1:]:
            total += v
        return total
    if op == "avg":
        mean = first
        for count, v in enumerate(vs[1:], start=2):
            if math.isinf(mean):
                if math.isinf(v) and (mean > 0) == (v > 0):
                    continue
                if not math.isinf(v) and not math.isnan(v):
                    continue
            mean += v / count - mean / count
        return mean
    if op in ("min", "max"):
        out = first
        for v in vs[1:]:
            if (out < v if op == "max" else out > v) or math.isnan(out):
                out = v
        return out
    if op == "count":
        return float(len(vs))
    if op == "group":
        return 1.0
    if op in ("stddev", "stdvar"):
        mean, total = first, 0.0
        for count, v in enumerate(vs[1:], start=2):
            delta = v - mean
            mean += delta / count
            total += delta * (v - mean)
        var = total / len(vs)
        return math.sqrt(var) if op == "stddev" else var
    if op == "quantile":
        return fn.quantile(param, vs)
    raise PromQLError(f"aggregation {op}")
