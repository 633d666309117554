"""The evaluator's side of promql.builtins: evaluates their arguments and shapes results.

    call(ev, node, t)       label_replace, absent, timestamp, the date functions, deriv, sort, ...
    aggregate(ev, node, t)  topk, bottomk, count_values
"""

from __future__ import annotations

from promql import builtins as b
from promql.binary import unique
from promql.parse import Call, PromQLError, Selector, String
from promql.storage import Labels, drop_name


def _string(node) -> str:
    if not isinstance(node, String):
        raise PromQLError("expected a string argument")
    return node.value


def call(ev, node: Call, t: int):
    f, args = node.func, node.args
    if f == "pi":
        return 3.141592653589793
    if f == "absent":
        return [] if ev.eval(args[0], t) else [(b.absent_labels(node.extra), 1.0)]
    if f == "absent_over_time":
        return [] if ev._range(args[0], t)[0] else [(b.absent_labels(node.extra), 1.0)]
    if f in b.SERIES:
        scalars = [ev._scalar(a, t) for a in args[1:]]
        out = []
        for lb, ts, vs in ev._range(args[0], t)[0]:
            v = b.series_value(f, ts, vs, t, scalars)
            if v is not None:
                out.append((drop_name(lb), v))
        return unique(out)
    if f in b.DATE:
        if not args:
            return [((), b.date_part(f, t / 1000))]
        return unique([(drop_name(lb), b.date_part(f, v)) for lb, v in ev.eval(args[0], t)])
    if f == "timestamp":
        return unique(_timestamp(ev, args[0], t))
    vec = ev.eval(args[0], t)
    if f == "label_replace":
        return unique(b.label_replace(vec, *(_string(a) for a in args[1:])))
    if f == "label_join":
        strings = [_string(a) for a in args[1:]]
        return unique(b.label_join(vec, strings[0], strings[1], strings[2:]))
    if f in ("sort", "sort_desc"):
        return b.by_value(vec, f == "sort_desc")
    raise PromQLError(f"function {f}() is not supported by slopilot's PromQL evaluator")


def _timestamp(ev, arg, t: int):
    """A selector gives its samples' own times (offset or not); anything else the evaluation time."""
    if isinstance(arg, Selector):
        at = ev.at(arg, t) - arg.offset
        times = getattr(ev.store, "instant_times", None)
        if times is None:
            raise PromQLError("timestamp() of a selector is not supported over this store")
        return [(drop_name(lb), ts / 1000) for lb, ts, _ in sorted(times(arg.matchers, at, ev.lookback))]
    return [(drop_name(lb), t / 1000) for lb, _ in ev.eval(arg, t)]


def _key(lb: Labels, grouping: set, without: bool) -> Labels:
    if without:
        return tuple(kv for kv in lb if kv[0] not in grouping and kv[0] != "__name__")
    return tuple(kv for kv in lb if kv[0] in grouping)


def aggregate(ev, node, t: int):
    grouping = set(node.grouping)
    if node.op == "count_values":
        label = b.valid_label(_string(node.param), "count_values()")
        if not node.without:
            grouping.add(label)
        counts: dict[Labels, float] = {}
        for lb, v in ev.eval(node.expr, t):
            key = _key(b._set(lb, label, b.format_float(v)), grouping, node.without)
            counts[key] = counts.get(key, 0.0) + 1.0
        return list(counts.items())
    k = b.k_of(ev._scalar(node.param, t))
    groups: dict[Labels, list] = {}
    for s in ev.eval(node.expr, t):
        groups.setdefault(_key(s[0], grouping, node.without), []).append(s)
    return [s for vs in groups.values() for s in b.select_k(vs, k, node.op == "topk")]
