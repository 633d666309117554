"""PromQL text -> the evaluator's own small syntax tree.

promql-parser (PyPI) does the parsing; this module walks its tree once, keeps what evaluation needs
(durations as integer milliseconds, regexes compiled, parentheses gone) and refuses, naming it, any
function, aggregation or modifier the evaluator does not implement: a query is answered as
Prometheus would answer it, or not at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import promql_parser as pp

from promql.bounds import query_problem
from promql.functions import AGGREGATIONS, FUNCTIONS


class PromQLError(ValueError):
    """A query that does not parse, uses something unsupported, or fails to evaluate."""


@dataclass(frozen=True, slots=True)
class Matcher:
    name: str
    op: str  # = != =~ !~
    value: str
    regex: re.Pattern | None = None

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        hit = self.regex.fullmatch(value) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True, slots=True)
class Number:
    value: float
    type = "scalar"


@dataclass(frozen=True, slots=True)
class String:
    value: str
    type = "string"


@dataclass(frozen=True, slots=True)
class Selector:
    matchers: tuple[Matcher, ...]
    offset: int = 0  # ms (negative: later)
    at: int | str | None = None  # @: ms, "start" or "end" (the query's); None: the evaluation time
    type = "vector"

    @property
    def name(self) -> str | None:
        return next((m.value for m in self.matchers if m.name == "__name__" and m.op == "="), None)


@dataclass(frozen=True, slots=True)
class MatrixSelector:
    selector: Selector
    range: int  # ms
    type = "matrix"


@dataclass(frozen=True, slots=True)
class Subquery:
    expr: object
    range: int  # ms
    step: int | None  # ms; None: the evaluator's default step
    offset: int = 0
    at: int | str | None = None
    type = "matrix"


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple
    type: str
    extra: tuple = ()  # absent() of a selector: its matchers, which make the labels of its answer


@dataclass(frozen=True, slots=True)
class Aggregate:
    op: str
    expr: object
    param: object | None
    grouping: tuple[str, ...]
    without: bool
    type = "vector"


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    lhs: object
    rhs: object
    type: str
    return_bool: bool = False
    card: str = "one-to-one"  # one-to-one, many-to-one, one-to-many, many-to-many
    on: bool = False
    labels: tuple[str, ...] = ()  # on(...) / ignoring(...)
    include: tuple[str, ...] = ()  # group_left(...) / group_right(...)


@dataclass(frozen=True, slots=True)
class Negate:
    expr: object

    @property
    def type(self) -> str:
        return self.expr.type


# the binding's enums are not hashable: keyed by their names
_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
_CARD = {"OneToOne": "one-to-one", "ManyToOne": "many-to-one", "OneToMany": "one-to-many",
         "ManyToMany": "many-to-many"}


def _enum(value) -> str:
    return str(value).rsplit(".", 1)[-1]
SET_OPS = ("and", "or", "unless")
MAX_SUBQUERY_STEPS = 100_000  # inner evaluations of one subquery at one instant


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NEGATIVE_AT = re.compile(r"@\s*-")


def ms(d: timedelta) -> int:
    return (d.days * 86400 + d.seconds) * 1000 + d.microseconds // 1000


def promql_duration(d: timedelta) -> str:
    return pp.display_duration(d)


def compile_query(text: str) -> object:
    """The syntax tree of `text`; PromQLError naming what does not parse or is not supported (or is
    too large to parse: promql.bounds)."""
    problem = query_problem(text)
    if problem is not None:
        raise PromQLError(f"query {_short(text)}: {problem}")
    if _NEGATIVE_AT.search(_QUOTED.sub('""', text)):  # the binding panics reading one
        raise _unsupported("an @ time before 1970")
    try:
        tree = pp.parse(text)
    except (ValueError, TypeError, OverflowError) as exc:  # OverflowError: a duration past timedelta's
        raise PromQLError(f"query {_short(text)} does not parse: {exc}") from None
    try:
        node = _convert(tree)
    except OverflowError as exc:  # the parser's durations become timedeltas as they are read
        raise PromQLError(f"query {_short(text)}: a duration is out of range ({exc})") from None
    if node.type not in ("vector", "scalar", "matrix"):
        raise PromQLError(f"query {text!r}: a {node.type} is not a query result the evaluator answers")
    return node


def _short(text: str) -> str:
    return repr(text) if len(text) <= 200 else f"{text[:200]!r}... ({len(text)} characters)"


def _unsupported(what: str) -> PromQLError:
    return PromQLError(f"{what} is not supported by slopilot's PromQL evaluator (supported: selectors, "
                       f"offset, subqueries, {', '.join(sorted(AGGREGATIONS))}, the arithmetic, comparison "
                       f"and set operators, and the functions {', '.join(sorted(FUNCTIONS))})")


def _at(e) -> int | str | None:
    """The @ modifier: ms since the epoch, "start" or "end"."""
    try:
        at = e.at
        if at is None:
            return None
        kind = _enum(at.type)
        return ms(at.at - _EPOCH) if kind == "At" else kind.lower()
    except BaseException as exc:  # the binding panics on a time before 1970
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _unsupported("an @ time before 1970") from None


def _selector(vs) -> Selector:
    if vs.matchers.or_matchers:
        raise _unsupported("`or` inside a label selector")
    offset = ms(vs.offset) if vs.offset is not None else 0
    matchers = [Matcher("__name__", "=", vs.name)] if vs.name else []
    for m in vs.matchers.matchers:
        op = _OPS[_enum(m.op)]
        regex = None
        if op in ("=~", "!~"):
            try:
                regex = re.compile(m.value)
            except re.error as exc:
                raise PromQLError(f"label matcher {m.name}{op}{m.value!r}: bad regex: {exc}") from None
        matchers.append(Matcher(m.name, op, m.value, regex))
    return Selector(tuple(matchers), offset, _at(vs))


def _convert(e) -> object:
    if isinstance(e, pp.ParenExpr):
        return _convert(e.expr)
    if isinstance(e, pp.NumberLiteral):
        return Number(float(e.val))
    if isinstance(e, pp.StringLiteral):
        return String(e.val)
    if isinstance(e, pp.VectorSelector):
        return _selector(e)
    if isinstance(e, pp.MatrixSelector):
        return MatrixSelector(_selector(e.vector_selector), ms(e.range))
    if isinstance(e, pp.SubqueryExpr):
        offset = ms(e.offset) if e.offset is not None else 0
        step = ms(e.step) if e.step is not None and ms(e.step) > 0 else None
        if step is not None and ms(e.range) // step > MAX_SUBQUERY_STEPS:
            raise PromQLError(f"subquery [{promql_duration(e.range)}:{promql_duration(e.step)}]: more than "
                              f"{MAX_SUBQUERY_STEPS} steps")
        return Subquery(_convert(e.expr), ms(e.range), step, offset, _at(e))
    if isinstance(e, pp.UnaryExpr):
        return Negate(_convert(e.expr))
    if isinstance(e, pp.Call):
        name = e.func.name
        if name not in FUNCTIONS:
            raise _unsupported(f"function {name}()")
        kinds, result = FUNCTIONS[name][:2]
        args = tuple(_convert(a) for a in e.args)
        most = 10**6 if kinds and kinds[-1].endswith("*") else len(kinds)
        if len(args) > most or len(args) < len([k for k in kinds if k[-1] not in "?*"]):
            raise PromQLError(f"function {name}() takes {len(kinds)} argument(s), got {len(args)}")
        extra = ()
        if name in ("absent", "absent_over_time") and isinstance(e.args[0], (pp.VectorSelector,
                                                                             pp.MatrixSelector)):
            extra = (args[0] if isinstance(args[0], Selector) else args[0].selector).matchers
        return Call(name, args, result, extra)
    if isinstance(e, pp.AggregateExpr):
        op = str(e.op)
        if op not in AGGREGATIONS:
            raise _unsupported(f"aggregation {op}()")
        param = _convert(e.param) if e.param is not None else None
        m = e.modifier
        without = m is not None and _enum(m.type) == "Without"
        grouping = tuple(sorted(m.labels)) if m is not None else ()
        return Aggregate(op, _convert(e.expr), param, grouping, without)
    if isinstance(e, pp.BinaryExpr):
        return _binary(e)
    raise _unsupported(f"the expression {type(e).__name__}")


def _binary(e) -> Binary:
    op = str(e.op)
    lhs, rhs = _convert(e.lhs), _convert(e.rhs)
    for side in (lhs, rhs):
        if side.type not in ("scalar", "vector"):
            raise PromQLError(f"binary operator {op}: operands must be instant vectors or scalars, "
                              f"not a {side.type}")
    kind = "scalar" if lhs.type == rhs.type == "scalar" else "vector"
    m = e.modifier
    if m is None:
        card = "many-to-many" if op in SET_OPS else "one-to-one"
        return Binary(op, lhs, rhs, kind, card=card)
    if getattr(m, "fill_values", None) is not None and (m.fill_values.lhs is not None
                                                         or m.fill_values.rhs is not None):
        raise _unsupported("fill modifiers")
    on = m.matching is not None and _enum(m.matching.type) == "Include"
    labels = tuple(sorted(m.matching.labels)) if m.matching is not None else ()
    return Binary(op, lhs, rhs, kind, bool(m.return_bool), _CARD[_enum(m.card)], on, labels,
                  tuple(m.group_labels or ()))


