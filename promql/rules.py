"""Prometheus recording rules: the rule-file format (groups of `record`/`expr`/`labels`), or a
Prometheus Operator PrometheusRule holding the same groups, evaluated as Prometheus does.

Each group runs at its interval (the global evaluation interval when it names none); its rules run
in order at the same instant, so a rule reads what the rules before it just wrote. A result gets
the record name as its metric name and the rule's labels; a series a rule no longer returns gets a
staleness marker; a rule that fails writes nothing that round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import promql_parser

from promql.engine import Evaluator
from promql.parse import PromQLError, compile_query, ms
from promql.storage import Labels, MemoryStorage

METRIC_NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*"


@dataclass
class Rule:
    record: str
    expr: str
    tree: object
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class RuleGroup:
    name: str
    interval: int | None  # ms; None: the global evaluation interval
    rules: list[Rule]
    limit: int = 0  # most series a rule may return (0: no limit)
    previous: list[set] = field(default_factory=list)  # each rule's series at the last evaluation
    errors: dict[str, str] = field(default_factory=dict)  # record -> last evaluation error


def _duration(text, where: str) -> int:
    try:
        value = ms(promql_parser.parse_duration(str(text)))
    except (ValueError, TypeError):
        raise ValueError(f"{where}: {text!r} is not a duration such as 15s or 1m") from None
    if value <= 0:
        raise ValueError(f"{where}: must be longer than 0")
    return value


def rule_groups(doc, where: str) -> list[RuleGroup]:
    """The groups of a rule file (a mapping with `groups`) or of a PrometheusRule (spec.groups);
    every error names `where` and the field."""
    if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
        doc, where = doc.get("spec") or {}, f"{where}: spec"
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise ValueError(f"{where}: a rule file is a mapping with a list of groups")
    groups, names = [], set()
    for gi, g in enumerate(doc["groups"]):
        at = f"{where}.groups[{gi}]"
        if not isinstance(g, dict) or not isinstance(g.get("name"), str) or not g["name"]:
            raise ValueError(f"{at}.name: every group needs a name")
        if g["name"] in names:
            raise ValueError(f"{at}.name: group {g['name']!r} is defined twice")
        names.add(g["name"])
        unknown = sorted(set(g) - {"name", "interval", "rules", "limit"})
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(unknown)}")
        interval = _duration(g["interval"], f"{at}.interval") if "interval" in g else None
        rules = []
        for ri, r in enumerate(g.get("rules") or []):
            rat = f"{at}.rules[{ri}]"
            if not isinstance(r, dict):
                raise ValueError(f"{rat}: must be a mapping with record and expr")
            if "alert" in r:
                raise ValueError(f"{rat}: alerting rule {r['alert']!r}: only recording rules are evaluated")
            unknown = sorted(set(r) - {"record", "expr", "labels"})
            if unknown:
                raise ValueError(f"{rat}: unknown field(s) {', '.join(unknown)}")
            record, expr = r.get("record"), r.get("expr")
            if not isinstance(record, str) or not re.fullmatch(METRIC_NAME, record):
                raise ValueError(f"{rat}.record: {record!r} is not a metric name")
            if not isinstance(expr, (str, int, float)) or isinstance(expr, bool):
                raise ValueError(f"{rat}.expr: a PromQL expression is required")
            labels = r.get("labels") or {}
            if not isinstance(labels, dict) or not all(isinstance(k, str) for k in labels):
                raise ValueError(f"{rat}.labels: must be a mapping of label names to values")
            try:
                tree = compile_query(str(expr))
            except PromQLError as exc:
                raise ValueError(f"{rat}.expr: {exc}") from None
            if tree.type not in ("vector", "scalar"):
                raise ValueError(f"{rat}.expr: must be an instant vector or a scalar, not a {tree.type}")
            rules.append(Rule(record, str(expr), tree, {str(k): str(v) for k, v in labels.items()}))
        limit = g.get("limit", 0)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"{at}.limit: must be a whole number >= 0")
        groups.append(RuleGroup(g["name"], interval, rules, limit, [set() for _ in rules]))
    return groups


def evaluate_group(group: RuleGroup, reader, out: MemoryStorage, t: int, default_step: int) -> None:
    """One evaluation of the group at t (ms): results appended to `out` (which `reader` includes)."""
    ev = Evaluator(reader, default_step=default_step)
    for i, rule in enumerate(group.rules):
        try:
            value = ev.eval(rule.tree, t)
            samples = _relabel(rule, [((), value)] if isinstance(value, float) else value)
            if group.limit and len(samples) > group.limit:
                raise PromQLError(f"exceeded limit of {group.limit} with {len(samples)} series")
        except PromQLError as exc:
            group.errors[rule.record] = str(exc)
            continue
        seen = set()
        for lb, v in samples:
            out.append(lb, t, v)
            seen.add(lb)
        for lb in group.previous[i] - seen:
            out.mark_stale(lb, t)
        group.previous[i] = seen


def _relabel(rule: Rule, vec) -> list[tuple[Labels, float]]:
    out = []
    for lb, v in vec:
        d = dict(lb)
        d["__name__"] = rule.record
        d.update(rule.labels)
        out.append((tuple(sorted((k, x) for k, x in d.items() if x != "")), v))
    if len({lb for lb, _ in out}) != len(out):
        raise PromQLError("vector contains metrics with the same labelset after applying rule labels")
    return out
