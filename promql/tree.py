"""Walking a compiled query: its nodes, and how far back in time it reads."""

from __future__ import annotations

from promql.parse import (
    Aggregate,
    Binary,
    Call,
    MatrixSelector,
    Negate,
    Selector,
    Subquery,
    _unsupported,
)


def children(node) -> tuple:
    if isinstance(node, MatrixSelector):
        return (node.selector,)
    if isinstance(node, (Subquery, Negate)):
        return (node.expr,)
    if isinstance(node, Call):
        return node.args
    if isinstance(node, Aggregate):
        return (node.expr,) + ((node.param,) if node.param is not None else ())
    if isinstance(node, Binary):
        return (node.lhs, node.rhs)
    return ()


def walk(node):
    """Every node of a tree, parents first."""
    yield node
    for c in children(node):
        yield from walk(c)


def metric_names(node) -> set[str]:
    """The metric names a query's selectors name (`__name__="..."`)."""
    return {n.name for n in walk(node) if isinstance(n, Selector) and n.name is not None}


def lookbehind(node, lookback: int) -> int:
    """How far before the evaluation time (ms) a query reads samples: what a store must keep."""
    if getattr(node, "at", None) is not None:
        raise _unsupported("the @ modifier in a query evaluated live")
    if isinstance(node, Selector):
        return max(0, node.offset + lookback)
    if isinstance(node, MatrixSelector):
        return lookbehind(node.selector, 0) + node.range
    if isinstance(node, Subquery):
        return max(0, node.offset + node.range + lookbehind(node.expr, lookback))
    return max((lookbehind(c, lookback) for c in children(node)), default=0)
