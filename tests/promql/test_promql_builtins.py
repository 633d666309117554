"""Pieces of promql.builtins that the Prometheus comparison cannot reach: Go's template
expansion corner cases, the RE2 guard, and timestamp() over the simulator's scraped targets."""

from __future__ import annotations

import re

import numpy as np
import pytest

from promql import Evaluator, PromQLError, compile_query
from promql.builtins import expand, go_regex, select_k
from promql.targets import Column, TargetStorage


@pytest.mark.parametrize("template, expected", [
    ("$1-$2", "a-b"), ("${1}x", "ax"), ("$1x", ""), ("$$1", "$1"), ("$", "$"), ("${1", "${1"),
    ("$name", "b"), ("${name}!", "b!"), ("$3", ""), ("$01", ""), ("a$-b", "a$-b"),
])
def test_expand_is_gos_expand_string(template, expected):
    m = re.compile("(?:(a)(?P<name>b))").fullmatch("ab")
    assert expand(template, m) == expected


@pytest.mark.parametrize("pattern", ["a(?=b)", "a(?!b)", "(?<=a)b", r"(a)\1", r"\Aa", "a*+", "(?x) a"])
def test_regexes_re2_reads_otherwise_are_refused(pattern):
    with pytest.raises(PromQLError, match="RE2"):
        go_regex(pattern, "label_replace()")


def test_ascii_classes_as_re2():
    assert go_regex(r"\d+", "x").fullmatch("١٢") is None  # Arabic-Indic digits: not \d in RE2


def test_topk_keeps_the_first_of_equals_and_nan_last():
    vs = [(("a",), 1.0), (("b",), float("nan")), (("c",), 1.0), (("d",), 2.0)]
    assert [lb for lb, _ in select_k(vs, 2, top=True)] == [("d",), ("a",)]
    assert sorted(lb for lb, _ in select_k(vs, 2, top=False)) == [("a",), ("c",)]  # equals: any order
    assert [lb for lb, _ in select_k(vs, 4, top=True)][-1] == ("b",)


def test_timestamp_over_scraped_targets_is_the_scrape_time():
    store = TargetStorage()
    cols = [Column("g", "gauge", (("__name__", "g"), ("pod", "p")), 0)]
    for t in (0, 5000, 10000):
        store.scrape("k", t, np.array([t / 10]), lambda: cols)
    ev = Evaluator(store)
    assert ev.eval(compile_query("timestamp(g)"), 12_000) == [((("pod", "p"),), 10.0)]
    assert ev.eval(compile_query("timestamp(g offset 4s)"), 12_000) == [((("pod", "p"),), 5.0)]
    assert ev.eval(compile_query("timestamp(g * 2)"), 12_000) == [((("pod", "p"),), 12.0)]


@pytest.mark.parametrize("query", ["year(vector(-1e11))", "hour(vector(NaN))", "month(vector(1e300))"])
def test_dates_python_cannot_hold_are_refused(query):
    with pytest.raises(PromQLError, match="not supported"):
        Evaluator(TargetStorage()).eval(compile_query(query), 0)


def test_dates_before_1970_are_gos():
    ev = Evaluator(TargetStorage())
    assert ev.eval(compile_query("year(vector(-1))"), 0) == [((), 1969.0)]
    assert ev.eval(compile_query("day_of_week(vector(-86400.9))"), 0) == [((), 3.0)]  # int64 truncates
