"""The arithmetic of PromQL's functions, as Prometheus 2.x computes it (pure, on plain lists).

Times are integer milliseconds, as Prometheus stores them; durations are turned into seconds only
where Prometheus does, so results agree to the last bits. Go's float semantics (x/0 = ±Inf, NaN
propagation, math.Mod, math.Pow) are kept where Python would raise.
"""

from __future__ import annotations

import math

import numpy as np

# name -> (argument kinds, result kind); "?" marks an optional argument
RANGE = ("rate", "irate", "increase", "delta", "idelta", "avg_over_time", "sum_over_time",
         "min_over_time", "max_over_time", "count_over_time", "last_over_time", "present_over_time",
         "stddev_over_time", "stdvar_over_time")
SIMPLE = {"abs": abs, "ceil": np.ceil, "floor": np.floor, "sqrt": np.sqrt, "exp": np.exp, "ln": np.log,
          "log2": np.log2, "log10": np.log10, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
          "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
          "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
          "deg": lambda v: v * 180 / math.pi, "rad": lambda v: v * math.pi / 180,
          "sgn": lambda v: -1.0 if v < 0 else 1.0 if v > 0 else v}
FUNCTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    **{f: (("matrix",), "vector") for f in RANGE},
    "quantile_over_time": (("scalar", "matrix"), "vector"),
    "histogram_quantile": (("scalar", "vector"), "vector"),
    **{f: (("vector",), "vector") for f in SIMPLE},
    "round": (("vector", "scalar?"), "vector"),
    "clamp": (("vector", "scalar", "scalar"), "vector"),
    "clamp_min": (("vector", "scalar"), "vector"),
    "clamp_max": (("vector", "scalar"), "vector"),
    "scalar": (("vector",), "scalar"),
    "vector": (("scalar",), "vector"),
    "time": ((), "scalar"),
}
# functions on labels, times and whole series (promql.builtins); "*": any number more
DATE = ("day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month", "year")
SERIES = ("changes", "resets", "deriv", "predict_linear")  # holt_winters: the parser lacks it
BUILTINS: dict[str, tuple[tuple[str, ...], str]] = {
    "label_replace": (("vector", "string", "string", "string", "string"), "vector"),
    "label_join": (("vector", "string", "string", "string*"), "vector"),
    "absent": (("vector",), "vector"),
    "absent_over_time": (("matrix",), "vector"),
    "timestamp": (("vector",), "vector"),
    **{f: (("vector?",), "vector") for f in DATE},
    **{f: (("matrix",), "vector") for f in ("changes", "resets", "deriv")},
    "predict_linear": (("matrix", "scalar"), "vector"),
    "sort": (("vector",), "vector"),
    "sort_desc": (("vector",), "vector"),
    "pi": ((), "scalar"),
}
FUNCTIONS.update(BUILTINS)
AGGREGATIONS = ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "quantile", "topk",
                "bottomk", "count_values")


def extrapolated_rate(ts: list, vs: list, start: float, end: float, is_counter: bool,
                      is_rate: bool) -> float | None:
    """rate/increase/delta over the range [start, end] (ms); None with fewer than two samples."""
    if len(ts) < 2:
        return None
    result = vs[-1] - vs[0]
    if is_counter:
        prev = vs[0]
        for v in vs[1:]:
            if v < prev:  # a counter reset: what was there before it counts too
                result += prev
            prev = v
    to_start = (ts[0] - start) / 1000
    to_end = (end - ts[-1]) / 1000
    sampled = (ts[-1] - ts[0]) / 1000
    average = sampled / (len(ts) - 1)
    if is_counter and result > 0 and vs[0] >= 0:
        to_zero = sampled * (vs[0] / result)  # a counter is never extrapolated below zero
        if to_zero < to_start:
            to_start = to_zero
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if is_rate:
        factor /= (end - start) / 1000
    return result * factor


def instant_value(ts: list, vs: list, is_rate: bool) -> float | None:
    """irate/idelta: from the last two samples; None with fewer than two."""
    if len(ts) < 2:
        return None
    last, prev = vs[-1], vs[-2]
    result = last if is_rate and last < prev else last - prev
    gap = ts[-1] - ts[-2]
    if gap == 0:
        return None
    return result / (gap / 1000) if is_rate else result


def kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def avg_over_time(vs: list) -> float:
    mean = c = 0.0
    for count, v in enumerate(vs, start=1):
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        mean, c = kahan_inc(v / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def sum_over_time(vs: list) -> float:
    total = c = 0.0
    for v in vs:
        total, c = kahan_inc(v, total, c)
    return total if math.isinf(total) else total + c


def _variance(vs: list) -> float:
    mean = c_mean = aux = c_aux = 0.0
    for count, v in enumerate(vs, start=1):
        delta = v - (mean + c_mean)
        mean, c_mean = kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / len(vs)


def min_max(vs: list, want_max: bool) -> float:
    out = vs[0]
    for v in vs:
        if (v > out if want_max else v < out) or math.isnan(out):
            out = v
    return out


def over_time(func: str, vs: list) -> float:
    if func == "avg_over_time":
        return avg_over_time(vs)
    if func == "sum_over_time":
        return sum_over_time(vs)
    if func in ("min_over_time", "max_over_time"):
        return min_max(vs, func == "max_over_time")
    if func == "count_over_time":
        return float(len(vs))
    if func == "last_over_time":
        return vs[-1]
    if func == "present_over_time":
        return 1.0
    if func == "stdvar_over_time":
        return _variance(vs)
    if func == "stddev_over_time":
        return math.sqrt(_variance(vs))
    raise ValueError(func)


def quantile(q: float, values: list) -> float:
    """The q-quantile of values (NaN sorts first), interpolated between neighbours."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    values = sorted(values, key=lambda v: (not math.isnan(v), v))
    n = len(values)
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1.0, lower + 1)
    weight = rank - math.floor(rank)
    return values[int(lower)] * (1 - weight) + values[int(upper)] * weight


def _search(n: int, pred) -> int:
    """Go's sort.Search: the smallest i in [0, n) with pred(i), by the same bisection."""
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not pred(h):
            i = h + 1
        else:
            j = h
    return i


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile over (upper bound, cumulative count) pairs of one histogram."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets:
        return math.nan
    ordered = sorted(buckets, key=lambda b: b[0])
    if not (math.isinf(ordered[-1][0]) and ordered[-1][0] > 0):
        return math.nan
    merged: list[list[float]] = []
    for le, count in ordered:  # equal upper bounds (several series folded together) add up
        if merged and merged[-1][0] == le:
            merged[-1][1] += count
        else:
            merged.append([le, count])
    top = merged[0][1]
    for b in merged[1:]:  # bucket counts may dip a hair (rates): the envelope keeps them monotonic
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return math.nan
    total = merged[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    b = _search(len(merged) - 1, lambda i: merged[i][1] >= rank)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def arith(op: str, a: float, b: float) -> float:
    """Arithmetic with Go's float semantics."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
        return a / b
    with np.errstate(all="ignore"):
        if op == "%":
            return float(np.fmod(np.float64(a), np.float64(b)))
        if op == "^":
            return float(np.power(np.float64(a), np.float64(b)))
        if op == "atan2":
            return math.atan2(a, b)
    raise ValueError(f"operator {op}")


def compare(op: str, a: float, b: float) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == ">":
        return a > b
    if op == "<":
        return a < b
    if op == ">=":
        return a >= b
    if op == "<=":
        return a <= b
    raise ValueError(f"operator {op}")


COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")


def simple(func: str, v: float) -> float:
    with np.errstate(all="ignore"):
        return float(SIMPLE[func](np.float64(v)))
