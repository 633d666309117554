"""Evaluates a compiled query at one instant over a store, with Prometheus 2.x's semantics.

    Evaluator(store).eval(tree, t_ms) -> float (scalar) | Vector | Matrix

Instant selectors look back 5 minutes (a staleness marker ends a series at once); ranges are closed
on both ends; subquery steps are aligned to multiples of the step since the epoch; every function
drops the metric name except last_over_time; vector matching, group_left/right and bool follow the
engine's rules, including its errors (duplicate series on the "one" side, many-to-one without
group_left, two results with the same labels). A range query is this evaluation repeated at each
step, which is what Prometheus computes too.
"""

from __future__ import annotations

import math
from operator import itemgetter

from promql import calls
from promql import functions as fn
from promql.binary import binary, unique
from promql.parse import (
    MAX_SUBQUERY_STEPS,
    Aggregate,
    Binary,
    Call,
    MatrixSelector,
    Negate,
    Number,
    PromQLError,
    Selector,
    Subquery,
)
from promql.reduce import reduce as _reduce
from promql.storage import Labels, Matrix, Vector, drop_name, get

LOOKBACK = 300_000  # ms: Prometheus' default query.lookback-delta
DEFAULT_STEP = 60_000  # ms: a subquery without a step uses the global evaluation_interval (1m default)
_first = itemgetter(0)


def go_float(text: str) -> float | None:
    """strconv.ParseFloat's reading of a label value (le): None when Go would refuse it."""
    if text != text.strip() or "_" in text or not text:
        return None
    try:
        return float(text)
    except ValueError:
        try:
            return float.fromhex(text)
        except ValueError:
            return None


def _go_min(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else min(a, b)


def _go_max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


class Evaluator:
    def __init__(self, store, lookback: int = LOOKBACK, default_step: int = DEFAULT_STEP):
        self.store = store
        self.lookback = lookback
        self.default_step = default_step
        self.bounds: tuple[int, int] | None = None  # the query's start and end, for @ start()/end()

    def at(self, node, t: int) -> int:
        """The time a selector or subquery is evaluated at before its offset: @ or t."""
        if node.at is None:
            return t
        if isinstance(node.at, int):
            return node.at
        if self.bounds is None:
            raise PromQLError(f"@ {node.at}() needs a query's start and end")
        return self.bounds[0] if node.at == "start" else self.bounds[1]

    def eval(self, node, t: int):
        if isinstance(node, Number):
            return node.value
        if isinstance(node, Selector):
            vec = self.store.instant(node.matchers, self.at(node, t) - node.offset, self.lookback)
            vec.sort(key=_first)
            return vec
        if isinstance(node, (MatrixSelector, Subquery)):
            return self._range(node, t)[0]
        if isinstance(node, Negate):
            inner = self.eval(node.expr, t)
            if isinstance(inner, float):
                return -inner
            return unique([(drop_name(lb), -v) for lb, v in inner])
        if isinstance(node, Call):
            return self._call(node, t)
        if isinstance(node, Aggregate):
            return self._aggregate(node, t)
        if isinstance(node, Binary):
            return self._binary(node, t)
        raise PromQLError(f"cannot evaluate {type(node).__name__}")

    # -- range vectors ------------------------------------------------------------------------------
    def _range(self, node, t: int) -> tuple[Matrix, int, int]:
        """(matrix, range start, range end) of a range selector or a subquery at t."""
        if isinstance(node, MatrixSelector):
            end = self.at(node.selector, t) - node.selector.offset
            start = end - node.range
            mat = self.store.window(node.selector.matchers, start, end)
            mat.sort(key=_first)
            return mat, start, end
        step = node.step or self.default_step
        end = self.at(node, t) - node.offset
        start = end - node.range
        first = step * (start // step)
        if first < start:
            first += step
        if (end - first) // step >= MAX_SUBQUERY_STEPS:
            raise PromQLError(f"subquery over {node.range} ms every {step} ms: more than "
                              f"{MAX_SUBQUERY_STEPS} steps")
        series: dict[Labels, tuple[list[int], list[float]]] = {}
        for at in range(first, end + 1, step):
            value = self.eval(node.expr, at)
            for lb, v in ([((), value)] if isinstance(value, float) else value):
                ts, vs = series.setdefault(lb, ([], []))
                ts.append(at)
                vs.append(v)
        return sorted(((lb, ts, vs) for lb, (ts, vs) in series.items()), key=_first), start, end

    # -- functions --------------------------------------------------------------------------------------
    def _scalar(self, node, t: int) -> float:
        v = self.eval(node, t)
        if not isinstance(v, float):
            raise PromQLError("expected a scalar argument")
        return v

    def _call(self, node: Call, t: int):
        f, args = node.func, node.args
        if f in fn.BUILTINS:
            return calls.call(self, node, t)
        if f in fn.RANGE or f == "quantile_over_time":
            q = self._scalar(args[0], t) if f == "quantile_over_time" else None
            mat, start, end = self._range(args[-1], t)
            out = []
            for lb, ts, vs in mat:
                if f in ("rate", "increase", "delta"):
                    v = fn.extrapolated_rate(ts, vs, start, end, f != "delta", f == "rate")
                elif f in ("irate", "idelta"):
                    v = fn.instant_value(ts, vs, f == "irate")
                elif q is not None:
                    v = fn.quantile(q, vs)
                else:
                    v = fn.over_time(f, vs)
                if v is not None:
                    out.append((lb if f == "last_over_time" else drop_name(lb), v))
            return unique(out)
        if f == "time":
            return t / 1000
        if f == "vector":
            return [((), self._scalar(args[0], t))]
        if f == "scalar":
            vec = self.eval(args[0], t)
            return vec[0][1] if len(vec) == 1 else math.nan
        if f == "histogram_quantile":
            return self._histogram_quantile(self._scalar(args[0], t), self.eval(args[1], t))
        vec = self.eval(args[0], t)
        if f == "clamp":
            lo, hi = self._scalar(args[1], t), self._scalar(args[2], t)
            if hi < lo:
                return []
            out = [(drop_name(lb), _go_max(lo, _go_min(hi, v))) for lb, v in vec]
        elif f == "clamp_min":
            lo = self._scalar(args[1], t)
            out = [(drop_name(lb), _go_max(lo, v)) for lb, v in vec]
        elif f == "clamp_max":
            hi = self._scalar(args[1], t)
            out = [(drop_name(lb), _go_min(hi, v)) for lb, v in vec]
        elif f == "round":
            inverse = fn.arith("/", 1.0, self._scalar(args[1], t) if len(args) > 1 else 1.0)
            out = [(drop_name(lb), fn.arith("/", fn.simple("floor", v * inverse + 0.5), inverse))
                   for lb, v in vec]
        else:
            out = [(drop_name(lb), fn.simple(f, v)) for lb, v in vec]
        return unique(out)

    @staticmethod
    def _histogram_quantile(q: float, vec: Vector) -> Vector:
        groups: dict[Labels, list] = {}
        for lb, v in vec:
            le = go_float(get(lb, "le"))
            if le is None:
                continue  # no or a malformed bucket label: skipped, as Prometheus does
            key = tuple(kv for kv in lb if kv[0] != "le")
            groups.setdefault(key, []).append((le, v))
        out = [(drop_name(key), fn.bucket_quantile(q, buckets)) for key, buckets in groups.items()]
        return unique(out)

    # -- aggregation ----------------------------------------------------------------------------------
    def _aggregate(self, node: Aggregate, t: int) -> Vector:
        if node.op in ("topk", "bottomk", "count_values"):
            return calls.aggregate(self, node, t)
        param = self._scalar(node.param, t) if node.param is not None else None
        vec = self.eval(node.expr, t)
        grouping, op = set(node.grouping), node.op
        groups: dict[Labels, list[float]] = {}
        for lb, v in vec:
            if node.without:
                key = tuple(kv for kv in lb if kv[0] not in grouping and kv[0] != "__name__")
            else:
                key = tuple(kv for kv in lb if kv[0] in grouping)
            groups.setdefault(key, []).append(v)
        return [(key, _reduce(op, vs, param)) for key, vs in groups.items()]

    # -- binary operators: promql.binary -------------------------------------------------------------
    def _binary(self, node: Binary, t: int):
        return binary(node, self.eval(node.lhs, t), self.eval(node.rhs, t))
