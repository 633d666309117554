"""The PromQL evaluator, table-tested against answers worked out by hand from Prometheus' rules (the
e2e test compares it with a real Prometheus): selection, lookback and staleness, rate extrapolation,
histogram_quantile's edge cases, aggregation, vector matching and its errors, subquery alignment,
the API's JSON shapes, OpenMetrics round trips, and refusals that name what is not supported."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from promql import MemoryStorage, PromQLError, compile_query, instant_query, labels_of, range_query
from promql.api import format_value
from promql.engine import Evaluator
from promql.functions import bucket_quantile, extrapolated_rate
from promql.openmetrics import read_openmetrics, write_openmetrics
from promql.targets import Column, TargetStorage

NAN, INF = math.nan, math.inf


def store() -> MemoryStorage:
    """Two pods sampled every 15 s from 0 to 285 s: a counter (pod b resets at 150 s), a gauge."""
    s = MemoryStorage()
    for i in range(20):
        t = 15_000 * i
        s.append(labels_of({"__name__": "req_total", "pod": "a", "job": "j"}), t, 10.0 * i)
        s.append(labels_of({"__name__": "req_total", "pod": "b", "job": "j"}), t, 5.0 * (i % 10))
        s.append(labels_of({"__name__": "q", "pod": "a", "job": "j"}), t, float(i % 4))
        s.append(labels_of({"__name__": "q", "pod": "b", "job": "j"}), t, 2.0)
        for le, frac in (("0.1", 0.5), ("1.0", 0.9), ("+Inf", 1.0)):
            s.append(labels_of({"__name__": "lat_bucket", "pod": "a", "le": le}), t, 100.0 * i * frac)
    return s


def value(query: str, t_s: float, s=None):
    out = Evaluator(s or store()).eval(compile_query(query), round(t_s * 1000))
    if isinstance(out, float):
        return out
    return {tuple((k, v) for k, v in lb if k != "job"): v for lb, v in out}


@pytest.mark.parametrize("query, t, want", [
    # 60 s window [120, 180] holds samples at 120..180 (closed both ends): 60 s of 10/15 s -> 40 exactly
    ('increase(req_total{pod="a"}[1m])', 180, {(("pod", "a"),): 40.0}),
    ('rate(req_total{pod="a"}[1m])', 180, {(("pod", "a"),): 40.0 / 60}),
    # window (112.5, 172.5]: samples 120..165 span 45 s; 7.5 s to each edge < 1.1 * 15: extrapolated
    ('increase(req_total{pod="a"}[1m])', 172.5, {(("pod", "a"),): 30.0 * 60 / 45}),
    # pod b: 35, 40, 45, then a reset to 0, 5 over [105, 165]: 5 - 35 plus the 45 before the drop
    ('increase(req_total{pod="b"}[1m])', 165, {(("pod", "b"),): 5 - 35 + 45}),
    ('irate(req_total{pod="b"}[1m])', 150, {(("pod", "b"),): 0.0 / 15}),
    ('irate(req_total{pod="b"}[1m])', 165, {(("pod", "b"),): 5.0 / 15}),
    ("sum(q)", 30, {(): 4.0}),
    ("avg_over_time(q{pod='a'}[1m])", 60, {(("pod", "a"),): (0 + 1 + 2 + 3 + 0) / 5}),
    ("max by (job) (q)", 45, {(): 3.0}),
    # lookback: the last sample (285 s) is seen for 5 minutes, then not
    ("count(q)", 585, {(): 2.0}),
    ("count(q)", 585.001, {}),
    ("q offset 1m", 75, {(("__name__", "q"), ("pod", "a")): 1.0, (("__name__", "q"), ("pod", "b")): 2.0}),
    ("q > 2", 45, {(("__name__", "q"), ("pod", "a")): 3.0}),
    ("q > bool 2", 45, {(("pod", "a"),): 1.0, (("pod", "b"),): 0.0}),
    ("2 < q", 45, {(("__name__", "q"), ("pod", "a")): 3.0}),
    ("q == on(pod) group_left q", 45, {(("__name__", "q"), ("pod", "a")): 3.0,
                                       (("__name__", "q"), ("pod", "b")): 2.0}),
    ('q unless on(pod) q{pod="a"}', 45, {(("__name__", "q"), ("pod", "b")): 2.0}),
    ('q{pod="a"} or on(pod) q', 45, {(("__name__", "q"), ("pod", "a")): 3.0,
                                     (("__name__", "q"), ("pod", "b")): 2.0}),
    ("scalar(q)", 45, NAN),
    ("vector(time())", 45, {(): 45.0}),
    ("clamp(q, 2.5, 2.8)", 45, {(("pod", "a"),): 2.8, (("pod", "b"),): 2.5}),
    ("clamp(q, 3, 1)", 45, {}),
    # histogram_quantile: rank 50 of 100 lands on the 0.1 bucket's top; 0.95 in (0.1, 1]; in +Inf
    ("histogram_quantile(0.5, rate(lat_bucket[1m]))", 60, {(("pod", "a"),): 0.1}),
    ("histogram_quantile(0.7, rate(lat_bucket[1m]))", 60, {(("pod", "a"),): 0.1 + 0.9 * (0.2 / 0.4)}),
    ("histogram_quantile(0.95, rate(lat_bucket[1m]))", 60, {(("pod", "a"),): 1.0}),
    ("histogram_quantile(2, rate(lat_bucket[1m]))", 60, {(("pod", "a"),): INF}),
    ("histogram_quantile(0.5, rate(lat_bucket[1m]))", 0, {}),  # one sample: no rate at all
    ("histogram_quantile(0.5, lat_bucket)", 0, {(("pod", "a"),): NAN}),  # all buckets empty
    # subquery [1m:30s] at 75 s: steps aligned to multiples of 30 s in [15, 75] -> 30 and 60
    ("count_over_time(sum(q)[1m:30s])", 75, {(): 2.0}),
    ("sum_over_time(sum(q)[1m:30s])", 75, {(): (2 + 2) + (0 + 2)}),
    ("-sum(q) % 3", 45, {(): -2.0}),
    ("sum(nothing) or vector(0)", 45, {(): 0.0}),
])
def test_evaluation(query, t, want):
    got = value(query, t)
    if isinstance(want, float):
        assert math.isnan(got) if math.isnan(want) else got == pytest.approx(want)
        return
    assert set(got) == set(want)
    for k, v in want.items():
        assert math.isnan(got[k]) if math.isnan(v) else got[k] == pytest.approx(v, rel=1e-12)


@pytest.mark.parametrize("query, message", [
    ("q + on(job) q", "duplicate series for the match group"),
    ("q * ignoring(pod) group_left sum by (job, pod) (q)", "duplicate series"),
    ("rate({__name__=~'req_total|q'}[1m])", "same labelset"),
])
def test_evaluation_errors_are_prometheus_errors(query, message):
    with pytest.raises(PromQLError, match=message):
        value(query, 45)


@pytest.mark.parametrize("query, named", [
    ("limitk(3, q)", "limitk()"),
    ("mad_over_time(q[5m])", "mad_over_time()"),
    ("sort_by_label(q, 'pod')", "sort_by_label()"),
    ("histogram_count(q)", "histogram_count()"),
    ("holt_winters(q[5m], 0.5, 0.5)", "does not parse"),
    ("q @ -100", "@ time before 1970"),
    ("sum(rate(q[1m] @ -5))", "@ time before 1970"),
    ('"text"', "a string is not a query result"),
    ("sum(q", "does not parse"),
    ("max_over_time(q[1d:1ms])", "more than 100000 steps"),
])
def test_unsupported_queries_are_refused_naming_what(query, named):
    with pytest.raises(PromQLError, match=named.replace("(", r"\(").replace(")", r"\)")):
        compile_query(query)


def test_extrapolation_never_goes_below_zero_and_needs_two_samples():
    # counter at 2 after 8 s, 12 after 18 s: zero was 2 s before the first sample, not 8 s
    assert extrapolated_rate([8000, 18000], [2, 12], 0, 18000, True, False) == pytest.approx(10 * 12 / 10)
    assert extrapolated_rate([5000], [3], 0, 10000, True, True) is None
    # a gauge (delta) is extrapolated below zero
    assert extrapolated_rate([8000, 18000], [2, 12], 0, 18000, False, False) == pytest.approx(10 * 18 / 10)


@pytest.mark.parametrize("q, buckets, want", [
    (0.5, [(0.1, 10), (0.5, 9.999), (INF, 20)], 0.1),  # a dip is evened out (envelope)
    (0.5, [(0.1, 5), (0.1, 5), (INF, 20)], 0.1),  # equal bounds add up
    (0.5, [(0.1, 1), (0.5, 2)], NAN),  # no +Inf bucket
    (0.5, [(INF, 5)], NAN),  # fewer than two buckets
    (0.2, [(-1.0, 10), (1.0, 20), (INF, 20)], -1.0),  # lowest bound <= 0: returned as it is
    (NAN, [(0.1, 1), (INF, 1)], NAN),
])
def test_bucket_quantile_edge_cases(q, buckets, want):
    got = bucket_quantile(q, buckets)
    assert math.isnan(got) if math.isnan(want) else got == pytest.approx(want)


def test_staleness_marker_ends_a_series_for_instant_queries_only():
    ts = TargetStorage()
    cols = lambda: [Column("g", "gauge", labels_of({"__name__": "g", "pod": "x"}), 0)]  # noqa: E731
    for t in (0, 15_000, 30_000):
        ts.scrape("x", t, np.array([7.0]), cols)
        ts.end_round(t, {"x"})
    ts.end_round(45_000, set())  # the target is gone: a marker at the next round
    ev = Evaluator(ts)
    assert ev.eval(compile_query("g"), 44_999) == [(labels_of({"__name__": "g", "pod": "x"}), 7.0)]
    assert ev.eval(compile_query("g"), 45_000) == []
    assert ev.eval(compile_query("count_over_time(g[1m])"), 50_000) == [(labels_of({"pod": "x"}), 3.0)]


def test_retention_drops_old_rows_and_empty_targets():
    ts = TargetStorage(retention=30_000)
    cols = lambda: [Column("g", "gauge", labels_of({"__name__": "g"}), 0)]  # noqa: E731
    for t in range(0, 100_000, 10_000):
        ts.scrape("x", t, np.array([float(t)]), cols)
        ts.end_round(t, {"x"})
    assert ts.targets["x"].ts == [60_000, 70_000, 80_000, 90_000]


def test_api_shapes_and_values():
    s = store()
    assert instant_query(s, "sum(q)", 30_000) == {
        "resultType": "vector", "result": [{"metric": {}, "value": [30, "4"]}]}
    assert instant_query(s, "1 / 0", 1_500)["result"] == [1.5, "+Inf"]
    m = instant_query(s, 'q{pod="b"}[30s]', 30_000)
    assert m["resultType"] == "matrix" and [v[0] for v in m["result"][0]["values"]] == [0, 15, 30]
    r = range_query(s, "sum(q)", 0, 60_000, 30_000)
    assert r == {"resultType": "matrix",
                 "result": [{"metric": {}, "values": [[0, "2"], [30, "4"], [60, "2"]]}]}
    with pytest.raises(PromQLError, match="range query"):
        range_query(s, "q[1m]", 0, 60_000, 30_000)
    assert [format_value(v) for v in (NAN, -INF, 1e-7, 2.5e22, 0.1)] == [
        "NaN", "-Inf", "0.0000001", "25000000000000000000000", "0.1"]


def test_openmetrics_round_trip_keeps_every_sample():
    s = MemoryStorage()
    s.append(labels_of({"__name__": "c_total", "pod": 'we"ird\\'}), 1_005, 1.0)
    s.append(labels_of({"__name__": "c_total", "pod": 'we"ird\\'}), 2_000, NAN)
    for le, v in (("0.5", 1.0), ("+Inf", 2.0)):
        s.append(labels_of({"__name__": "h_bucket", "le": le}), 1_000, v)
    s.append(labels_of({"__name__": "h_count"}), 1_000, 2.0)
    s.append(labels_of({"__name__": "h_sum"}), 1_000, 0.7)
    families = [("c", "counter", [(x.labels, x.ts, x.vs) for x in s.by_name["c_total"]]),
                ("h", "histogram", [(x.labels, x.ts, x.vs) for n in ("h_bucket", "h_count", "h_sum")
                                    for x in s.by_name[n]])]
    buf = io.StringIO()
    assert write_openmetrics(buf, families) == 6
    text = buf.getvalue()
    assert text.startswith("# TYPE c counter\n") and text.endswith("# EOF\n")
    back = read_openmetrics(io.StringIO(text))
    assert set(back.series) == set(s.series)
    for lb, series in s.series.items():
        assert back.series[lb].ts == series.ts
        assert np.array_equal(back.series[lb].vs, series.vs, equal_nan=True)
