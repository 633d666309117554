"""Instant and range queries with the answers in the JSON shape of Prometheus' HTTP API.

    instant_query(store, 'sum(rate(x[1m]))', t_ms)                  -> {"resultType": ..., "result": ...}
    range_query(store, 'sum(x)', start_ms, end_ms, step_ms)       -> {"resultType": "matrix", ...}

Values are strings as Prometheus writes them ("NaN", "+Inf", shortest decimal without exponent);
timestamps are seconds.
"""

from __future__ import annotations

import math

import numpy as np

from promql.engine import LOOKBACK, Evaluator
from promql.parse import Aggregate, Call, PromQLError, compile_query
from promql.storage import Labels

MAX_POINTS = 11_000  # Prometheus refuses range queries with more points per series


def format_value(v: float) -> str:
    """strconv.FormatFloat(v, 'f', -1, 64), as the API writes sample values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-", unique=True)


def format_time(t: int) -> int | float:
    return t // 1000 if t % 1000 == 0 else t / 1000


def _metric(labels: Labels) -> dict[str, str]:
    return dict(labels)


def _tree(query):
    return compile_query(query) if isinstance(query, str) else query


def instant_query(store, query, t: int, lookback: int = LOOKBACK) -> dict:
    """The `data` of /api/v1/query at t (ms)."""
    tree = _tree(query)
    ev = Evaluator(store, lookback)
    ev.bounds = (t, t)
    value = ev.eval(tree, t)
    if tree.type == "scalar":
        return {"resultType": "scalar", "result": [format_time(t), format_value(value)]}
    if tree.type == "matrix":
        return {"resultType": "matrix", "result": [
            {"metric": _metric(lb), "values": [[format_time(x), format_value(v)] for x, v in zip(ts, vs)]}
            for lb, ts, vs in sorted(value, key=lambda s: s[0])]}
    if not _ordered(tree):
        value = sorted(value, key=lambda s: s[0])
    return {"resultType": "vector", "result": [
        {"metric": _metric(lb), "value": [format_time(t), format_value(v)]} for lb, v in value]}


def _ordered(tree) -> bool:
    """sort(), sort_desc(), topk() and bottomk() answer instant queries in their own order."""
    return (isinstance(tree, Call) and tree.func in ("sort", "sort_desc")
            or isinstance(tree, Aggregate) and tree.op in ("topk", "bottomk"))


def range_query(store, query, start: int, end: int, step: int, lookback: int = LOOKBACK) -> dict:
    """The `data` of /api/v1/query_range from start to end (ms), every step (ms)."""
    tree = _tree(query)
    if tree.type not in ("vector", "scalar"):
        raise PromQLError(f"invalid expression type {tree.type!r} for range query, must be a scalar or "
                          "an instant vector")
    if step <= 0:
        raise PromQLError("zero or negative query resolution step widths are not accepted")
    if end < start:
        raise PromQLError("end timestamp must not be before start time")
    if (end - start) // step + 1 > MAX_POINTS:
        raise PromQLError(f"exceeded maximum resolution of {MAX_POINTS} points per timeseries; "
                          "try decreasing the query resolution (?step=XX)")
    ev = Evaluator(store, lookback)
    ev.bounds = (start, end)
    series: dict[Labels, list] = {}
    for t in range(start, end + 1, step):
        value = ev.eval(tree, t)
        for lb, v in ([((), value)] if isinstance(value, float) else value):
            series.setdefault(lb, []).append([format_time(t), format_value(v)])
    return {"resultType": "matrix", "result": [{"metric": _metric(lb), "values": pts}
                                               for lb, pts in sorted(series.items())]}


def success(data: dict) -> dict:
    return {"status": "success", "data": data}
