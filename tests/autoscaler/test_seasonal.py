"""The learned seasonal profile: online learning, its forecast, a controller restart, a replayed history."""

import json
import math

import pytest

from autoscaler.observation import Observation
from autoscaler.seasonal import Profile, train
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy

DAY = 3600.0  # a short "day" keeps the tests fast; the arithmetic does not depend on its length
SLOS = [SloTarget("ttft", 2.0, 90), SloTarget("tpot", 0.1, 90)]


class Step:
    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context):
        return 10.0 + 0.05 * prefill_tokens + 0.2 * decode_seqs + 1e-4 * decode_context


def curve(t: float, level: float = 1.0) -> float:
    return level * 8.0 * (1 - 0.7 * math.cos(2 * math.pi * t / DAY))


def days(n: int, step: float = 30.0, level: float = 1.0):
    t = 0.0
    while t < n * DAY:
        yield t, curve(t, level)
        t += step


def test_profile_learns_the_shape_and_forecasts_at_todays_level():
    p = train(Profile(DAY, bins=48), days(2))
    assert p.forecast(0.0, 1.0, 10.0) is not None
    # from the trough to the peak, scaled to a day 10% busier than the ones learned
    now, at = 2 * DAY + 0.1 * DAY, 2 * DAY + 0.4 * DAY
    got = p.forecast(now, curve(now, 1.1), at)
    assert got == pytest.approx(curve(at, 1.1), rel=0.05)


def test_unlearned_bins_give_no_forecast():
    p = train(Profile(DAY, bins=48), days(1, step=30.0))
    p2 = Profile(DAY, bins=48)
    assert p2.forecast(0.0, 5.0, 100.0) is None
    # half a day learned: a forecast into the unlearned half is None
    half = train(Profile(DAY, bins=48), ((t, r) for t, r in days(1) if t < DAY / 2))
    assert half.forecast(0.1 * DAY, 5.0, 0.8 * DAY) is None
    assert p.forecast(0.1 * DAY, 5.0, 0.8 * DAY) is not None


def test_weekly_bins_take_over_once_seen():
    p = Profile(DAY, bins=4, weekly=True)
    for d in range(8):  # day 7 (the weekday of day 0) is twice as busy as the rest
        for k in range(4):
            p.observe(d * DAY + (k + 0.5) * DAY / 4, 20.0 if d % 7 == 0 else 10.0)
    p.observe(8 * DAY + 1, 10.0)  # folds day 7's last bin
    assert p.level(7 * DAY + DAY / 2) == pytest.approx(20.0)
    assert p.level(3 * DAY + DAY / 2) == pytest.approx(10.0)


def policy(**kw) -> SloModelPolicy:
    return SloModelPolicy(SLOS, Step(), startup_delay=120, polling_interval=30, season_period=DAY,
                          season_bins=48, **kw)


def obs(t: float, rate: float) -> Observation:
    return Observation(time=t, current_replicas=2, arrival_rate=rate, mean_prompt_tokens=1000,
                       mean_output_tokens=200)


def test_profile_survives_a_controller_restart():
    a = policy()
    for t, r in days(2):
        a.decide(obs(t, r))
    saved = json.loads(json.dumps(a.state_dict()))  # what the controller writes and reads back
    b = policy()
    b.load_state_dict(saved)
    pa, pb = a.forecast.profile, b.forecast.profile
    assert pb.day == pa.day and pb.day_n == pa.day_n
    t = 2 * DAY + 0.1 * DAY
    assert pb.forecast(t, 5.0, t + 150) == pa.forecast(t, 5.0, t + 150) is not None
    later = [(t, curve(t)) for t in range(int(2.1 * DAY), int(2.3 * DAY), 30)]
    assert [a.decide(obs(t, r)) for t, r in later] == [b.decide(obs(t, r)) for t, r in later]
    assert policy().forecast.profile.forecast(t, 5.0, t + 150) is None  # nothing learned without the state


def test_a_replayed_history_pretrains_the_profile():
    history = list(days(2))
    pre = policy(season_weight=1.0)
    train(pre.forecast.profile, history)
    online = policy(season_weight=1.0)
    for t, r in history:
        online.decide(obs(t, r))
    assert pre.forecast.profile.day == pytest.approx(online.forecast.profile.day)
    # pre-trained, the look-ahead on a rising morning is nearer the truth than the trend's
    trend_only = SloModelPolicy(SLOS, Step(), startup_delay=120, polling_interval=30)
    start = 2 * DAY
    for t in range(int(start), int(start + 0.1 * DAY), 30):
        d_pre = pre.demand(obs(t, curve(t)))
        d_trend = trend_only.demand(obs(t, curve(t)))
    assert d_pre == pytest.approx(curve(t + 150), rel=0.05)
    assert abs(d_pre - curve(t + 150)) <= abs(d_trend - curve(t + 150)) + 1e-9


def test_a_profile_of_another_shape_is_not_loaded():
    a = train(Profile(DAY, bins=48), days(1))
    b = Profile(DAY, bins=24)
    b.load_state_dict(a.state_dict())
    assert b.day_n == [0] * 24
