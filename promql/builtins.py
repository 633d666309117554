"""PromQL functions that work on labels, times and whole series, as Prometheus 2.42 computes them.

label_replace/label_join (Go's regexp template expansion), absent/absent_over_time (labels from the
selector's equality matchers), timestamp and the date functions (UTC, Go's int64 truncation),
changes/resets/deriv/predict_linear, sort/sort_desc, and topk/bottomk/count_values.
Where Go's and Python's behaviour could part (regex syntax, dates past year 9999, NaN times) the
query is refused rather than answered differently.
"""

from __future__ import annotations

import calendar
import math
import re
from datetime import datetime, timedelta, timezone

import numpy as np

from promql import functions as fn
from promql.functions import DATE, SERIES  # noqa: F401  (the table lives there)
from promql.parse import PromQLError
from promql.storage import Labels, get

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# RE2 has none of these; Python would accept them with a meaning Prometheus never gives
_NOT_RE2 = re.compile(r"\(\?[=!<]|\(\?P=|\\[1-9]|\\[AZz]|[*+?}]\+|\(\?[a-zA-Z]*[ax]")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def go_regex(pattern: str, where: str) -> re.Pattern:
    """`pattern` compiled as RE2 reads it (ASCII classes), or a PromQLError where the two differ."""
    if _NOT_RE2.search(pattern):
        raise PromQLError(f"{where}: regex {pattern!r} uses syntax RE2 lacks or reads differently; "
                          "not supported by slopilot's PromQL evaluator")
    try:
        return re.compile(pattern, re.ASCII)
    except re.error as exc:
        raise PromQLError(f"{where}: invalid regular expression {pattern!r}: {exc}") from None


def _extract(s: str):
    """Go's regexp extract(): (name, number or -1, rest) of a $-reference, or None if malformed."""
    brace = s.startswith("{")
    if brace:
        s = s[1:]
    i = 0
    while i < len(s) and (s[i].isalpha() or s[i].isdigit() or s[i] == "_"):
        i += 1
    if i == 0:
        return None
    name = s[:i]
    if brace:
        if i >= len(s) or s[i] != "}":
            return None
        i += 1
    num = int(name) if name.isascii() and name.isdigit() and len(name) < 9 else -1
    if name[0] == "0" and len(name) > 1:
        num = -1
    return name, num, s[i:]


def expand(template: str, m: re.Match) -> str:
    """Go's Regexp.ExpandString: $1, ${1}, $name, ${name}, $$; an unknown group expands to ""."""
    out = []
    while True:
        before, sep, after = template.partition("$")
        out.append(before)
        if not sep:
            return "".join(out)
        if after.startswith("$"):
            out.append("$")
            template = after[1:]
            continue
        ref = _extract(after)
        if ref is None:
            out.append("$")
            template = after
            continue
        name, num, template = ref
        if num >= 0:
            if num <= (m.re.groups) and m.group(num) is not None:
                out.append(m.group(num))
        elif name in m.re.groupindex and m.group(name) is not None:
            out.append(m.group(name))


def _set(labels: Labels, name: str, value: str) -> Labels:
    d = dict(labels)
    if value:
        d[name] = value
    else:
        d.pop(name, None)
    return tuple(sorted(d.items()))


def _dst(name: str, func: str) -> str:
    if not _LABEL_NAME.fullmatch(name):
        raise PromQLError(f"invalid destination label name in {func}(): {name}")
    return name


def label_replace(vec, dst: str, repl: str, src: str, regex: str):
    rx = go_regex(f"(?:{regex})", "label_replace()")
    _dst(dst, "label_replace")
    out = []
    for lb, v in vec:
        m = rx.fullmatch(get(lb, src))
        out.append((_set(lb, dst, expand(repl, m)) if m else lb, v))
    return out


def label_join(vec, dst: str, sep: str, srcs: list[str]):
    _dst(dst, "label_join")
    return [(_set(lb, dst, sep.join(get(lb, s) for s in srcs)), v) for lb, v in vec]


def _utc(v: float) -> datetime:
    if math.isnan(v) or math.isinf(v) or abs(v) >= 2.5e11:
        raise PromQLError(f"a date function of {v!r} (not a time Python's calendar holds) is "
                          "not supported by slopilot's PromQL evaluator")
    try:
        return _EPOCH + timedelta(seconds=int(v))  # Go: time.Unix(int64(v), 0).UTC()
    except OverflowError:  # before the year 1
        raise PromQLError(f"a date function of {v!r} (before the year 1) is not supported by "
                          "slopilot's PromQL evaluator") from None


def date_part(func: str, v: float) -> float:
    d = _utc(v)
    return float({"day_of_month": d.day, "day_of_week": (d.weekday() + 1) % 7,
                  "day_of_year": d.timetuple().tm_yday,
                  "days_in_month": calendar.monthrange(d.year, d.month)[1], "hour": d.hour,
                  "minute": d.minute, "month": d.month, "year": d.year}[func])


def linear_regression(ts: list, vs: list, intercept_time: int) -> tuple[float, float]:
    """Least squares through (seconds since intercept_time, value), with Kahan sums as Prometheus."""
    if all(v == vs[0] for v in vs):
        return (math.nan, math.nan) if math.isinf(vs[0]) else (0.0, vs[0])
    n = 0.0
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    for t, v in zip(ts, vs):
        n += 1.0
        x = (t - intercept_time) / 1e3
        sx, cx = fn.kahan_inc(x, sx, cx)
        sy, cy = fn.kahan_inc(v, sy, cy)
        sxy, cxy = fn.kahan_inc(x * v, sxy, cxy)
        sx2, cx2 = fn.kahan_inc(x * x, sx2, cx2)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = fn.arith("/", cov, var)
    return slope, sy / n - slope * sx / n


def series_value(func: str, ts: list, vs: list, t: int, args: list[float]) -> float | None:
    """One series of changes/resets/deriv/predict_linear; None: no output for it."""
    if func in ("changes", "resets"):
        count = 0
        for prev, cur in zip(vs, vs[1:]):
            if func == "resets":
                count += cur < prev
            else:
                count += cur != prev and not (math.isnan(cur) and math.isnan(prev))
        return float(count)
    if len(ts) < 2:
        return None
    if func == "deriv":
        return linear_regression(ts, vs, ts[0])[0]
    slope, intercept = linear_regression(ts, vs, t)
    return slope * args[0] + intercept


def absent_labels(matchers) -> Labels:
    """The labels absent() gives an empty selector: its equality matchers, a label matched twice or
    by anything else dropped (Prometheus' historic rule)."""
    d: dict[str, str] = {}
    seen: set[str] = set()
    for m in matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in seen:
            d[m.name] = m.value
            seen.add(m.name)
        else:
            d.pop(m.name, None)
    return tuple(sorted((k, v) for k, v in d.items() if v))


def by_value(vec, descending: bool):
    """sort/sort_desc: NaN last either way; ties keep their (label) order."""
    if descending:
        return sorted(vec, key=lambda s: (math.isnan(s[1]), -s[1] if not math.isnan(s[1]) else 0))
    return sorted(vec, key=lambda s: (math.isnan(s[1]), s[1] if not math.isnan(s[1]) else 0))


def k_of(param: float) -> int:
    if math.isnan(param) or not -9.2e18 < param < 9.2e18:
        raise PromQLError(f"Scalar value {param} overflows int64")
    return int(param)


def _less(a: float, b: float, top: bool) -> bool:
    """Prometheus' heap order: NaN first, then the smallest (topk) or the largest (bottomk) on top."""
    if math.isnan(a):
        return True
    return a < b if top else a > b


def _up(h: list, j: int, top: bool) -> None:  # Go's container/heap, step for step: ties break alike
    while True:
        i = (j - 1) // 2
        if j <= 0 or not _less(h[j][1], h[i][1], top):
            return
        h[i], h[j] = h[j], h[i]
        j = i


def _down(h: list, i0: int, top: bool) -> bool:
    i, n = i0, len(h)
    while True:
        j = 2 * i + 1
        if j >= n:
            break
        if j + 1 < n and _less(h[j + 1][1], h[j][1], top):
            j += 1
        if not _less(h[j][1], h[i][1], top):
            break
        h[i], h[j] = h[j], h[i]
        i = j
    return i > i0


def select_k(vs: list, k: int, top: bool) -> list:
    """topk/bottomk of one group as Prometheus' heap keeps them (NaN loses to any number, an equal
    value never displaces one kept), best first."""
    if k < 1:
        return []
    heap: list = []
    for s in vs:
        if len(heap) < k:
            heap.append(s)
            _up(heap, len(heap) - 1, top)
            continue
        root = heap[0][1]
        better = root < s[1] if top else root > s[1]
        if better or (math.isnan(root) and not math.isnan(s[1])):
            heap[0] = s
            if k > 1 and not _down(heap, 0, top):
                _up(heap, 0, top)
    return by_value(heap, descending=top)


def format_float(v: float) -> str:
    """strconv.FormatFloat(v, 'f', -1, 64): count_values' label value."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-", unique=True)


def valid_label(name: str, what: str) -> str:
    if not _LABEL_NAME.fullmatch(name):
        raise PromQLError(f"invalid label name {name!r} in {what}")
    return name
