"""The PromQL the scrape source answers, with the one evaluator (promql): Prometheus' rate
extrapolation, histogram_quantile and aggregation semantics, table-tested in seconds as the source
stores them; the queries a live source refuses, with a reason."""

import math

import numpy as np
import pytest

from controlplane.sources.scrape import ScrapeSource
from promql import Evaluator, MemoryStorage, PromQLError, compile_query, labels_of
from promql.functions import bucket_quantile
from promql.functions import extrapolated_rate as rate_ms
from simulator.metrics import extrapolated_increase

INF = math.inf


def extrapolated_rate(ts, vs, start, end, is_rate):
    """promql's rate/increase of a counter, with times in seconds."""
    return rate_ms([t * 1000 for t in ts], vs, start * 1000, end * 1000, True, is_rate)


@pytest.mark.parametrize("ts, vs, start, end, want_increase", [
    # samples 10 s apart, touching both edges: no extrapolation needed beyond the samples
    ([0, 10, 20, 30], [0, 10, 20, 30], 0, 30, 30),
    # 5 s gaps at both edges (< 1.1 x the 10 s spacing): extrapolated to the edges, 30 * 40/30
    ([105, 115, 125, 135], [100, 110, 120, 130], 100, 140, 40),
    # the series starts inside the range (first gap 25 s > 11 s): half an interval at the start
    ([125, 135], [100, 110], 100, 140, 10 * (10 + 5 + 5) / 10),
    # a counter reset (30 -> 5): the increase counts the 5 after the reset
    ([0, 10, 20, 30], [10, 30, 5, 15], 0, 30, 20 + 5 + 10),
    # durationToZero: a counter that started at 0 shortly before the first sample is not extrapolated
    # back past zero (first value 2, increase 10 over 10 s: zero was 2 s before the first sample)
    ([8, 18], [2, 12], 0, 18, 10 * (10 + 2) / 10),
])
def test_extrapolated_rate_follows_prometheus(ts, vs, start, end, want_increase):
    inc = extrapolated_rate(ts, vs, start, end, is_rate=False)
    assert inc == pytest.approx(want_increase)
    assert extrapolated_rate(ts, vs, start, end, is_rate=True) == pytest.approx(want_increase / (end - start))


def test_extrapolated_rate_needs_two_samples():
    assert extrapolated_rate([5.0], [3.0], 0, 10, True) is None
    assert extrapolated_rate([], [], 0, 10, True) is None


def test_extrapolated_rate_agrees_with_the_simulators_implementation():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        ts = np.sort(rng.uniform(0, 60, n))
        ts = list(np.unique(ts))
        vs = np.cumsum(rng.integers(0, 50, len(ts))).astype(float)
        if rng.random() < 0.3:  # a restart somewhere
            k = int(rng.integers(1, len(vs)))
            vs[k:] -= vs[k - 1]
        if len(ts) < 2:
            continue
        ours = extrapolated_rate(ts, list(vs), 0.0, 60.0, is_rate=False)
        sims = extrapolated_increase(ts, [np.array([v]) for v in vs], 0.0, 60.0)
        assert ours == pytest.approx(float(sims[0]), rel=1e-12, abs=1e-12)


LE = [0.1, 0.5, 1.0, INF]


@pytest.mark.parametrize("q, counts, want", [
    (0.5, [10, 20, 20, 20], 0.1),  # rank 10 lands on the first bucket's top
    (0.75, [10, 20, 20, 20], 0.1 + 0.4 * 5 / 10),  # linear inside (0.1, 0.5]
    (0.25, [10, 20, 20, 20], 0.05),  # the first bucket starts at 0
    (0.99, [0, 0, 10, 20], 1.0),  # in the +Inf bucket: the highest finite bound
    (0.5, [0, 0, 0, 0], math.nan),  # no observations
    (-0.1, [1, 1, 1, 1], -INF),
    (1.1, [1, 1, 1, 1], INF),
    (0.5, [10, 9.999, 20, 20], 0.1),  # a hair non-monotonic (bucket rates): clamped, as Prometheus does
])
def test_bucket_quantile_follows_prometheus(q, counts, want):
    got = bucket_quantile(q, list(zip(LE, counts)))
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want)


def test_bucket_quantile_needs_the_inf_bucket_and_two_buckets():
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1), (0.5, 2)]))
    assert math.isnan(bucket_quantile(0.5, [(INF, 5)]))
    # duplicate bounds (e.g. two series summed without `by (le)` folded in) are added up
    assert bucket_quantile(0.5, [(0.1, 5), (0.1, 5), (INF, 20)]) == pytest.approx(0.1)


@pytest.mark.parametrize("text, message", [
    ("x[5m]", "is a range vector"),
    ("sum(x", "does not parse"),
    ("x @ 100", "the @ modifier"),
])
def test_queries_a_live_source_cannot_answer_are_refused_with_a_reason(text, message):
    src = ScrapeSource([])
    with pytest.raises(PromQLError, match=message):
        src.compile(text)


def fake_store() -> MemoryStorage:
    """Two engines; counters sampled every 10 s over [0, 60]; gauges sampled at 60."""
    store = MemoryStorage()
    for labels, v in (({"__name__": "w", "instance": "a", "model_name": "m"}, 3.0),
                      ({"__name__": "w", "instance": "b", "model_name": "m"}, 5.0),
                      ({"__name__": "w", "instance": "c", "model_name": "other"}, 100.0)):
        store.append(labels_of(labels), 60_000, v)
    ts = [0, 10, 20, 30, 40, 50, 60]
    series = [({"__name__": "c_total", "instance": "a"}, [10 * t for t in ts]),
              ({"__name__": "c_total", "instance": "b"}, [2 * t for t in ts])]
    for inst, cumulative in (("a", [1, 2, 2]), ("b", [0, 1, 1])):  # observations per second
        for le, rate in zip(("0.1", "1", "+Inf"), cumulative):
            labels = {"__name__": "h_bucket", "instance": inst, "le": le}
            series.append((labels, [float(rate) * t for t in ts]))
    for labels, vs in series:
        for t, v in zip(ts, vs):
            store.append(labels_of(labels), t * 1000, float(v))
    return store


def query(text: str, store: MemoryStorage, at: float) -> list[tuple[dict, float]]:
    out = Evaluator(store).eval(compile_query(text), round(at * 1000))
    return [({}, out)] if isinstance(out, float) else [(dict(lb), v) for lb, v in out]


@pytest.mark.parametrize("text, want", [
    ('sum(w{model_name="m"})', [({}, 8.0)]),
    ('avg(w{model_name="m"})', [({}, 4.0)]),
    ('max(w) by (model_name)', [({"model_name": "m"}, 5.0), ({"model_name": "other"}, 100.0)]),
    ('count(w{model_name=~"m|o.*"})', [({}, 3.0)]),
    ('sum without (instance) (w{model_name!="other"})', [({"model_name": "m"}, 8.0)]),
    ("sum(rate(c_total[30s]))", [({}, 12.0)]),
    ("sum(increase(c_total[60s]))", [({}, 720.0)]),
    ("rate(c_total{instance='b'}[1m])", [({"instance": "b"}, 2.0)]),
    ("sum(rate(c_total[30s])) / sum(w{model_name='m'}) * 2", [({}, 3.0)]),
    ("2 * 3 + 1", [({}, 7.0)]),
    # observations per second: a 1 (<=0.1), 1 (<=1), 0 (+Inf); b 0, 1, 0 -> cumulative 1, 3, 3
    ("histogram_quantile(0.5, sum by (le) (rate(h_bucket[1m])))", [({}, 0.1 + 0.9 * 0.5 / 2)]),
    ("histogram_quantile(0.9, sum(rate(h_bucket[1m])) by (le, instance))",
     [({"instance": "a"}, 0.1 + 0.9 * 0.8), ({"instance": "b"}, 0.1 + 0.9 * 0.9)]),
])
def test_evaluation(text, want):
    got = sorted(query(text, fake_store(), at=60.0), key=lambda s: sorted(s[0].items()))
    want = sorted(want, key=lambda s: sorted(s[0].items()))
    assert [lb for lb, _ in got] == [lb for lb, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want])


def test_bare_selector_keeps_every_series():
    got = query("w", fake_store(), at=60.0)
    assert len(got) == 3 and {lb["instance"] for lb, _ in got} == {"a", "b", "c"}
