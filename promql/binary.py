"""Binary operators between evaluated operands, with Prometheus 2.x's rules: scalar arithmetic and
comparisons, a vector against a scalar, the set operators (and, or, unless), and vector matching
(on/ignoring, group_left/group_right, bool), including the engine's errors for duplicate series on the
"one" side and for many-to-one matches without a group modifier."""

from __future__ import annotations

from promql import functions as fn
from promql.parse import Binary, PromQLError
from promql.storage import Labels, Vector, drop_name, format_labels


def unique(vec: Vector) -> Vector:
    """vec, or the engine's error when two of its samples have the same labels."""
    if len({lb for lb, _ in vec}) != len(vec):
        raise PromQLError("vector cannot contain metrics with the same labelset")
    return vec


def binary(node: Binary, lhs, rhs):
    """lhs op rhs, each operand a float (scalar) or a Vector already evaluated."""
    op = node.op
    comparison = op in fn.COMPARISONS
    if isinstance(lhs, float) and isinstance(rhs, float):
        if comparison:
            return 1.0 if fn.compare(op, lhs, rhs) else 0.0
        return fn.arith(op, lhs, rhs)
    if isinstance(rhs, float) or isinstance(lhs, float):
        swap = isinstance(lhs, float)
        vec, scalar = (rhs, lhs) if swap else (lhs, rhs)
        out = []
        for lb, v in vec:
            a, b = (scalar, v) if swap else (v, scalar)
            if comparison:
                keep = fn.compare(op, a, b)
                if node.return_bool:
                    out.append((drop_name(lb), 1.0 if keep else 0.0))
                elif keep:
                    out.append((lb, v))
            else:
                out.append((drop_name(lb), fn.arith(op, a, b)))
        return unique(out)
    if op in ("and", "or", "unless"):
        return _set_op(node, lhs, rhs)
    return unique(_match(node, lhs, rhs))

def _signature(node: Binary):
    names = set(node.labels)
    if node.on:
        return lambda lb: tuple(kv for kv in lb if kv[0] in names)
    return lambda lb: tuple(kv for kv in lb if kv[0] not in names and kv[0] != "__name__")

def _set_op(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    sig = _signature(node)
    if node.op == "and":
        if not lhs or not rhs:
            return []
        right = {sig(lb) for lb, _ in rhs}
        return [s for s in lhs if sig(s[0]) in right]
    if node.op == "or":
        if not lhs or not rhs:
            return list(lhs or rhs)
        left = {sig(lb) for lb, _ in lhs}
        return list(lhs) + [s for s in rhs if sig(s[0]) not in left]
    if not lhs or not rhs:
        return list(lhs)
    right = {sig(lb) for lb, _ in rhs}
    return [s for s in lhs if sig(s[0]) not in right]

def _match(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    if not lhs or not rhs:
        return []
    sig = _signature(node)
    swapped = node.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    index: dict[tuple, tuple[Labels, float]] = {}
    for lb, v in one:
        s = sig(lb)
        if s in index:
            side = "left" if swapped else "right"
            raise PromQLError(f"found duplicate series for the match group {dict(s)} on the {side} "
                              f"hand-side of the operation: [{format_labels(lb)}, "
                              f"{format_labels(index[s][0])}];many-to-many matching not allowed: "
                              "matching labels must be unique on one side")
        index[s] = (lb, v)
    comparison = node.op in fn.COMPARISONS
    matched: dict[tuple, set | None] = {}
    out = []
    for lb, v in many:
        s = sig(lb)
        hit = index.get(s)
        if hit is None:
            continue
        a, b = (hit[1], v) if swapped else (v, hit[1])
        if comparison:
            keep = fn.compare(node.op, a, b)
            value = (1.0 if keep else 0.0) if node.return_bool else a
            if not keep and not node.return_bool:
                continue
        else:
            value = fn.arith(node.op, a, b)
        metric = _result_labels(node, lb, hit[0], comparison)
        if node.card == "one-to-one":
            if s in matched:
                raise PromQLError("multiple matches for labels: many-to-one matching must be explicit "
                                  "(group_left/group_right)")
            matched[s] = None
        else:
            seen = matched.setdefault(s, set())
            if metric in seen:
                raise PromQLError("multiple matches for labels: grouping labels must ensure unique "
                                  "matches")
            seen.add(metric)
        out.append((metric, value))
    return out

def _result_labels(node: Binary, many: Labels, one: Labels, comparison: bool) -> Labels:
    d = dict(many)
    if not comparison or node.return_bool:
        d.pop("__name__", None)
    if node.card == "one-to-one":
        if node.on:
            d = {k: v for k, v in d.items() if k in node.labels}
        else:
            for k in node.labels:
                d.pop(k, None)
    if node.include:
        other = dict(one)
        for k in node.include:
            if other.get(k):
                d[k] = other[k]
            else:
                d.pop(k, None)
    return tuple(sorted(d.items()))
