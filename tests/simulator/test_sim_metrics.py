"""Metrics as Prometheus sees them: histogram_quantile, rate over windows, closed-form histogram updates."""

import math

import numpy as np
import pytest

from simulator.metrics import MetricStore, extrapolated_increase, histogram_quantile, quantile_of
from simulator.replica_metrics import HISTOGRAMS, LAYOUT, ReplicaMetrics


def test_histogram_quantile_interpolates_like_promql():
    le = (0.1, 0.5, 1.0)
    # cumulative counts 10, 30, 40, +Inf 40: p50 -> rank 20 in (0.1, 0.5]: 0.1 + 0.4 * 10/20
    assert histogram_quantile(0.5, le, np.array([10, 30, 40, 40.0])) == pytest.approx(0.3)
    assert histogram_quantile(0.1, le, np.array([10, 30, 40, 40.0])) == pytest.approx(
        0.04
    )  # rank 4 of 10 in (0, 0.1]
    # rank in the first bucket interpolates from 0
    assert histogram_quantile(0.05, le, np.array([10, 30, 40, 40.0])) == pytest.approx(0.05 * 40 / 10 * 0.1)
    # in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, le, np.array([10, 30, 40, 50.0])) == 1.0
    assert math.isnan(histogram_quantile(0.5, le, np.zeros(4)))


def test_increase_extrapolates_to_window_edges():
    ts = [15.0, 30.0, 45.0, 60.0]
    vs = [np.array([v]) for v in (10.0, 20.0, 30.0, 40.0)]
    # samples span 45 s of a 60 s window starting at 0; gap to start (15) < 1.1 * 15 -> extrapolate fully,
    # but not below zero: the counter would reach 0 after 15 s back, exactly the start
    inc = extrapolated_increase(ts, vs, 0.0, 60.0)
    assert inc[0] == pytest.approx(40.0)
    # a counter reset adds back the value before the drop
    vs2 = [np.array([v]) for v in (10.0, 20.0, 5.0, 15.0)]
    assert extrapolated_increase(ts, vs2, 15.0, 60.0)[0] == pytest.approx(25.0)
    assert extrapolated_increase(ts[:1], vs[:1], 0, 60) is None


def test_observe_arithmetic_equals_individual_observations():
    a, b = ReplicaMetrics(), ReplicaMetrics()
    first, step, n, w = 0.02, 0.0013, 400, 3
    a.observe_arithmetic("inter_token_latency_seconds", first, step, n, w)
    for j in range(n):
        b.observe("inter_token_latency_seconds", first + step * j, w)
    sl = LAYOUT["inter_token_latency_seconds_bucket"]
    np.testing.assert_array_equal(a.v[sl], b.v[sl])
    assert a.v[LAYOUT["inter_token_latency_seconds_count"]] == n * w
    assert a.v[LAYOUT["inter_token_latency_seconds_sum"]] == pytest.approx(
        b.v[LAYOUT["inter_token_latency_seconds_sum"]]
    )


def test_store_rate_and_quantile_over_window():
    store = MetricStore()
    m = ReplicaMetrics()
    for t in range(0, 121, 15):
        if t > 0:
            for _ in range(30):  # 2 requests/s, TTFT 0.3 s
                m.observe("time_to_first_token_seconds", 0.3)
                m.inc("request_success")
        store.scrape((0, 0), float(t), m.cumulative(), {"waiting": 4})
    rates = store.rate([(0, 0)], 120.0, 60.0)
    assert rates[LAYOUT["request_success"]] == pytest.approx(2.0)
    q = quantile_of(rates, "time_to_first_token_seconds", 0.9)
    le = HISTOGRAMS["time_to_first_token_seconds"]
    assert 0.25 < q <= 0.5 and le[le.index(0.5)] == 0.5
    assert store.gauge([(0, 0)], "waiting", 120.0) == [4]
    assert store.gauge([(0, 0)], "waiting", 1000.0) == []  # stale after 5 minutes
