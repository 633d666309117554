"""The PromQL subset the direct-scrape source answers itself, evaluated as Prometheus 2.x does.

Shapes: a selector `name{label="v", label=~"re", ...}`; rate()/increase() of a selector over a range
`[30s]`; sum/avg/min/max/count with `by (...)` or `without (...)`; histogram_quantile(q, ...); and
+ - * / between those and numbers (one-to-one on equal label sets). Anything else raises Unsupported,
so the caller reports a clear per-trigger error instead of a wrong number. Rate extrapolation and
bucket interpolation are the full evaluator's (promql, tested against Prometheus).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Protocol

from promql import functions as shared
from promql.bounds import query_problem

Labels = dict[str, str]
Vector = list[tuple[Labels, float]]

AGGREGATIONS = ("sum", "avg", "min", "max", "count")
RANGE_FUNCTIONS = ("rate", "increase")
SUPPORTED = (
    "a selector, rate()/increase() over a range, sum/avg/min/max/count [by|without (...)], "
    "histogram_quantile(q, ...), and + - * / between them and numbers"
)


class Unsupported(ValueError):
    """The query is valid PromQL, perhaps, but outside the subset answered without Prometheus."""


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()  # (label, op, value), op in = != =~ !~

    def matches(self, labels: Labels) -> bool:
        for label, op, value in self.matchers:
            have = labels.get(label, "")
            if op == "=" and have != value or op == "!=" and have == value:
                return False
            if op in ("=~", "!~") and (re.fullmatch(value, have) is not None) != (op == "=~"):
                return False
        return True


@dataclass(frozen=True)
class RangeCall:
    func: str
    selector: Selector
    seconds: float


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: object
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Quantile:
    q: float
    expr: object


@dataclass(frozen=True)
class Binary:
    op: str
    left: object
    right: object


class Store(Protocol):
    def instant(self, sel: Selector, at: float) -> Vector: ...

    def range(self, sel: Selector, start: float, end: float) -> list[tuple[Labels, list[float], list[float]]]:
        """(labels, times, values) of each matching series with samples in [start, end]."""


# ---- parsing ---------------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"\s*(?:(?P<range>\[[^\]]*\])|(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<str>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`)"
    r"|(?P<op>=~|!=|!~|=|[(){},+\-*/]))"
)
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text: str) -> float:
    """A PromQL duration such as 30s, 5m or 1m30s."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"bad duration {text!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _tokens(query: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(query):
        m = _TOKEN.match(query, pos)
        if m is None or m.end() == pos:
            if query[pos:].strip() == "":
                break
            raise ValueError(f"cannot parse {query[pos:pos + 20]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, query: str):
        self.toks = _tokens(query)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            raise ValueError(f"expected {value or kind}, found {tok[1] if tok else 'the end'}")
        self.i += 1
        return tok[1]

    def expr(self, ops: tuple[str, ...] = ("+", "-")):
        left = self.term() if ops == ("+", "-") else self.atom()
        while self.peek() is not None and self.peek()[1] in ops:
            op = self.take()
            right = self.term() if ops == ("+", "-") else self.atom()
            left = Binary(op, left, right)
        return left

    def term(self):
        return self.expr(("*", "/"))

    def grouping(self) -> tuple[str, tuple[str, ...]] | None:
        tok = self.peek()
        if tok is None or tok[1] not in ("by", "without"):
            return None
        kind = self.take()
        self.take("(")
        labels = []
        while self.peek() is not None and self.peek()[1] != ")":
            labels.append(self.take(kind="ident"))
            if self.peek() is not None and self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return kind, tuple(labels)

    def atom(self):
        kind, value = self.peek() or ("", "")
        if kind == "num":
            self.take()
            return float(value)
        if value == "(":
            self.take("(")
            inner = self.expr()
            self.take(")")
            return inner
        if kind != "ident":
            raise ValueError(f"unexpected {value or 'end of query'}")
        self.take()
        if value in AGGREGATIONS:
            group = self.grouping()
            self.take("(")
            inner = self.expr()
            self.take(")")
            group = group or self.grouping()
            if group is None:
                return Aggregate(value, inner)
            return Aggregate(value, inner, *((group[1], None) if group[0] == "by" else (None, group[1])))
        if value == "histogram_quantile":
            self.take("(")
            q = float(self.take(kind="num"))
            self.take(",")
            inner = self.expr()
            self.take(")")
            return Quantile(q, inner)
        if value in RANGE_FUNCTIONS:
            self.take("(")
            sel = self.selector(self.take(kind="ident"))
            window = duration_seconds(self.take(kind="range")[1:-1])
            self.take(")")
            return RangeCall(value, sel, window)
        if self.peek() is not None and self.peek()[1] == "(":
            raise Unsupported(f"function {value}() is not answered without Prometheus ({SUPPORTED})")
        if self.peek() is not None and self.peek()[0] == "range":
            raise Unsupported(f"a range vector ({value}[...]) needs rate() or increase() here")
        return self.selector(value)

    def selector(self, name: str) -> Selector:
        matchers = []
        if self.peek() is not None and self.peek()[1] == "{":
            self.take("{")
            while self.peek() is not None and self.peek()[1] != "}":
                label = self.take(kind="ident")
                op = self.take(kind="op")
                if op not in ("=", "!=", "=~", "!~"):
                    raise ValueError(f"bad label matcher {op!r}")
                raw = self.take(kind="str")
                matchers.append((label, op, raw[1:-1] if raw[0] == "`" else ast.literal_eval(raw)))
                if self.peek() is not None and self.peek()[1] == ",":
                    self.take(",")
            self.take("}")
        return Selector(name, tuple(matchers))


def parse(query: str):
    """The query's syntax tree; Unsupported (a ValueError) when outside the subset or malformed."""
    problem = query_problem(query)
    if problem is not None:
        raise Unsupported(f"query {query[:200]!r}: {problem}")
    try:
        p = _Parser(query)
        tree = p.expr()
        if p.peek() is not None:
            raise ValueError(f"unexpected {p.peek()[1]!r}")
    except Unsupported:
        raise
    except (ValueError, SyntaxError) as exc:
        raise Unsupported(f"query {query!r}: {exc} (supported without Prometheus: {SUPPORTED})") from None
    return tree


def metric_names(tree) -> set[str]:
    """The metric names a syntax tree selects."""
    if isinstance(tree, Selector):
        return {tree.name}
    if isinstance(tree, RangeCall):
        return {tree.selector.name}
    if isinstance(tree, (Aggregate, Quantile)):
        return metric_names(tree.expr)
    if isinstance(tree, Binary):
        return metric_names(tree.left) | metric_names(tree.right)
    return set()


# ---- evaluation --------------------------------------------------------------------------------------
def extrapolated_rate(ts: list[float], vs: list[float], start: float, end: float,
                      is_rate: bool) -> float | None:
    """Prometheus' extrapolatedRate for a counter over [start, end] (seconds); None with fewer than 2
    samples. The arithmetic is the shared evaluator's (promql), in milliseconds."""
    return shared.extrapolated_rate([t * 1000 for t in ts], vs, start * 1000, end * 1000, True, is_rate)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over (upper bound, cumulative count) pairs of one histogram."""
    return shared.bucket_quantile(q, buckets)


def _drop_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != "__name__"}


def _key(labels: Labels) -> tuple:
    return tuple(sorted(labels.items()))


def _aggregate(node: Aggregate, vec: Vector) -> Vector:
    groups: dict[tuple, tuple[Labels, list[float]]] = {}
    for labels, v in vec:
        if node.by is not None:
            g = {k: labels[k] for k in node.by if k in labels}
        elif node.without is not None:
            g = {k: x for k, x in labels.items() if k not in node.without and k != "__name__"}
        else:
            g = {}
        groups.setdefault(_key(g), (g, []))[1].append(v)
    fn = {"sum": sum, "avg": lambda xs: sum(xs) / len(xs), "min": min, "max": max, "count": len}[node.op]
    return [(g, float(fn(xs))) for g, xs in groups.values()]


def _arith(op: str, a: float, b: float) -> float:
    if op == "/":
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
        return a / b
    return a + b if op == "+" else a - b if op == "-" else a * b


def _quantile(node: Quantile, vec: Vector) -> Vector:
    groups: dict[tuple, tuple[Labels, list[tuple[float, float]]]] = {}
    for labels, v in vec:
        if "le" not in labels:
            continue
        try:
            le = float(labels["le"])
        except ValueError:
            continue
        g = {k: x for k, x in labels.items() if k not in ("le", "__name__")}
        groups.setdefault(_key(g), (g, []))[1].append((le, v))
    return [(g, bucket_quantile(node.q, b)) for g, b in groups.values()]


def evaluate(tree, store: Store, at: float) -> Vector | float:
    """The instant-query answer at time `at`: a vector, or a number for a constant expression."""
    if isinstance(tree, float):
        return tree
    if isinstance(tree, Selector):
        return store.instant(tree, at)
    if isinstance(tree, RangeCall):
        out = []
        for labels, ts, vs in store.range(tree.selector, at - tree.seconds, at):
            r = extrapolated_rate(ts, vs, at - tree.seconds, at, tree.func == "rate")
            if r is not None:
                out.append((_drop_name(labels), r))
        return out
    if isinstance(tree, Aggregate):
        inner = evaluate(tree.expr, store, at)
        if isinstance(inner, float):
            raise Unsupported(f"{tree.op}() of a number")
        return _aggregate(tree, inner)
    if isinstance(tree, Quantile):
        inner = evaluate(tree.expr, store, at)
        if isinstance(inner, float):
            raise Unsupported("histogram_quantile() of a number")
        return _quantile(tree, inner)
    left, right = evaluate(tree.left, store, at), evaluate(tree.right, store, at)
    if isinstance(left, float) and isinstance(right, float):
        return _arith(tree.op, left, right)
    if isinstance(left, float):
        return [(_drop_name(lb), _arith(tree.op, left, v)) for lb, v in right]
    if isinstance(right, float):
        return [(_drop_name(lb), _arith(tree.op, v, right)) for lb, v in left]
    index = {_key(_drop_name(lb)): v for lb, v in right}  # one-to-one matching on all labels
    return [(_drop_name(lb), _arith(tree.op, v, index[k])) for lb, v in left
            if (k := _key(_drop_name(lb))) in index]


def query(text: str, store: Store, at: float) -> Vector:
    """Parse and evaluate; a constant expression comes back as one sample without labels."""
    out = evaluate(parse(text), store, at)
    return [({}, out)] if isinstance(out, float) else out
