"""autoscaler.forecast.Demand on its own: a table of arrival-rate series and options -> the rate to
provision for, each value worked out by hand in the comment beside it, and its state across a restart."""

from __future__ import annotations

import json

import pytest

from autoscaler.forecast import Demand, DemandOptions
from autoscaler.observation import Observation

STARTUP, POLL = 120.0, 30.0


def series(rates, **extra):
    """(time, rate, extra Observation fields) every POLL seconds from 0."""
    return [(POLL * i, r, extra) for i, r in enumerate(rates)]


FLAT = series([4.0] * 11)
RAMP = series([1 + 0.3 * i for i in range(11)])  # 1 + 0.01 t
# a flat 2.0 +- 0.1, then 6.0 at t = 300: (240, 1.9), (270, 2.1), (300, 6.0)
BURST = series([2.0 + (0.1 if i % 2 else -0.1) for i in range(10)] + [6.0])
# the same flat 2.0 +- 0.1 to t = 240 (1.9 there), then a ramp: 3.0 at 270, 4.0 at 300
RISE = series([2.0 + (0.1 if i % 2 else -0.1) for i in range(9)] + [3.0, 4.0])
# a rise of 0.02 / s to t = 210, then falling 6, 5, 4 at 240, 270, 300
FALL = series([2 + 0.6 * i for i in range(8)] + [6.0, 5.0, 4.0])


def counters(rate: float, n: int, queue: float = 0.0, batch: float = 0.0, batch_queue: float = 0.0):
    """The router's counters rising at `rate` req/s (batch of them at `batch`), its queues held."""
    return [(POLL * i, 1.0, {"metrics": {"arrivals": rate * POLL * i, "queue": queue,
                                         "batch_arrivals": batch * POLL * i, "batch_queue": batch_queue}})
            for i in range(n)]


CASES = [
    # (name, options, series, expected)
    ("flat", {}, FLAT, 4.0),  # a constant rate forecasts itself
    ("backlog", {"drain_seconds": 60}, series([2.0] * 11, num_waiting=120.0), 4.0),  # 2 + 120 / 60
    ("long trend", {}, RAMP, 5.2),  # the line at now + startup: 1 + 0.01 x 420
    # the short trend through the last three samples, at now + startup + one poll (450 s):
    # mean (270, 10/3), slope 123 / 1800, so 10/3 + 0.068333 x 180
    ("burst, trend", {}, BURST, 15.633333),
    ("burst, last", {"burst_slope": "last"}, BURST, 25.5),  # 6 + (6 - 2.1) / 30 x 150
    ("burst, onset", {"burst_slope": "onset"}, BURST, 15.633333),  # the ramp since the onset: the same 3
    ("burst, not trusted", {"burst_z": 1000.0}, BURST, 6.0),  # noise gate shut: the long fit, the rate now
    # a ramp's first sample hides it from the test on the whole window: the line through every earlier
    # sample (3.0 at 270 among them) is 2.393 at 300 with a spread of 0.275, so the rate now must pass
    # 2.393 + 6 x 0.275 = 4.045; 4.0 does not: the rate now (over the long trend's 3.417 at 420)
    ("ramp, window baseline", {"burst_z": 6.0}, RISE, 4.0),
    # on the samples before the short window (to t = 240) the line is 1.989 with a spread of 0.099:
    # 4.0 > 2.585, a burst; the short trend through (240, 1.9), (270, 3.0), (300, 4.0) at 450:
    # 2.966667 + 0.035 x 180
    ("ramp, beforeTrend baseline", {"burst_z": 6.0, "burst_baseline": "beforeTrend"}, RISE, 9.266667),
    ("tail, kept", {}, FALL, 6.753939),  # the long trend still points up over the falling tail
    ("tail, dropped", {"drop_on_fall": True}, FALL, 4.0),  # drop_on_fall: provision for the rate now
    # fast signals: the counter's rise over the fast window (8 req/s), the gateway queue drained in 60 s
    ("fast signals", {"arrivals_query": "a", "queue_query": "q"}, counters(8.0, 11, queue=60.0), 9.0),
    # a batch band: interactive 6 (trend of the total less batch) + batch's mean 2 + 1800 / (3600 / 2)
    ("batch band", {"arrivals_query": "a", "batch_arrivals_query": "b"},
     counters(8.0, 11, queue=1800.0, batch=2.0, batch_queue=1800.0), 9.0),
]


def run(demand: Demand, rows) -> float:
    out = None
    for t, rate, extra in rows:
        out = demand.rate(Observation(time=t, current_replicas=2, arrival_rate=rate, **extra))
    return out


@pytest.mark.parametrize("name,options,rows,expected", CASES, ids=[c[0] for c in CASES])
def test_demand_table(name, options, rows, expected):
    assert run(Demand(DemandOptions(**options), STARTUP, POLL), rows) == pytest.approx(expected, rel=1e-6)


def test_state_survives_a_restart():
    opts = DemandOptions(arrivals_query="a", season_period=3600, season_bins=12)
    rows = counters(8.0, 30)
    a = Demand(opts, STARTUP, POLL)
    run(a, rows[:20])
    b = Demand(opts, STARTUP, POLL)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # what a controller writes and reads back
    assert set(a.state_dict()) == {"rates", "counts", "profile"}
    assert [run(a, [r]) for r in rows[20:]] == [run(b, [r]) for r in rows[20:]]
    assert set(Demand(DemandOptions()).state_dict()) == {"rates"}  # only what its options use


def test_options_are_checked():
    with pytest.raises(ValueError, match="burstSlope: must be trend, last or onset"):
        DemandOptions(burst_slope="steep")
    with pytest.raises(ValueError, match="burstBaseline: must be one of window, beforeTrend"):
        DemandOptions(burst_baseline="before")
