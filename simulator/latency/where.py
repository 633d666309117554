"""A tiny, safe row filter: `batch_size > 16 or num_tokens > 2048`, `phase == "decode"`.

Parsed with `ast` and evaluated over numpy columns; only names of columns, numbers, strings,
arithmetic (+ - * / %), comparisons, `in (...)`, and/or/not and parentheses are accepted.
"""

from __future__ import annotations

import ast
import operator

import numpy as np

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Mod: operator.mod}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}


def _columns(profile) -> dict[str, np.ndarray]:
    cols = {c: np.array(v) for c, v in profile.text.items()}
    cols.update(profile.num)
    return cols


def evaluate_where(expr: str, profile) -> np.ndarray:
    """Boolean mask of the rows of a profile.Profile matching expr."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"bad expression {expr!r}: {exc.msg}") from None
    cols = _columns(profile)
    n = len(profile)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BoolOp):
            vals = [np.asarray(ev(v), dtype=bool) for v in node.values]
            fn = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = vals[0]
            for v in vals[1:]:
                out = fn(out, v)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~np.asarray(ev(node.operand), dtype=bool)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return _BIN[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            out, left = np.ones(n, dtype=bool), ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if not isinstance(comp, (ast.Tuple, ast.List)):
                        raise ValueError(f"bad expression {expr!r}: 'in' needs a literal list")
                    hit = np.isin(left, [ev(e) for e in comp.elts])
                    out &= hit if isinstance(op, ast.In) else ~hit
                    continue  # a membership test ends a chain
                if type(op) not in _CMP:
                    raise ValueError(f"bad expression {expr!r}: operator not allowed")
                right = ev(comp)
                out &= np.asarray(_CMP[type(op)](left, right), dtype=bool)
                left = right
            return out
        if isinstance(node, ast.Name):
            if node.id not in cols:
                raise ValueError(f"bad expression {expr!r}: unknown column {node.id!r} "
                                 f"(columns: {', '.join(cols)})")
            return cols[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)) \
                and not isinstance(node.value, bool):
            return node.value
        raise ValueError(f"bad expression {expr!r}: {type(node).__name__} is not allowed")

    try:
        result = np.broadcast_to(np.asarray(ev(tree)), (n,))
    except TypeError as exc:  # e.g. comparing a text column with a number
        raise ValueError(f"bad expression {expr!r}: {exc}") from None
    if result.dtype != bool:
        raise ValueError(f"bad expression {expr!r}: it is not a condition (true/false per row)")
    return result.copy()
