"""Policies beyond the upstream tables: the ratio law, model-based SLO headroom, KPA, KEDA details,
the expression evaluator, state round trips and the KEDA export."""

import json
import math

import pytest

from autoscaler import Observation, load_spec, make_policy
from autoscaler.export import to_scaled_object
from autoscaler.expr import Formula, evaluate
from autoscaler.forecast import linear_forecast
from autoscaler.keda import Fallback, KedaConfig, KedaPolicy, Trigger, fallback_replicas
from autoscaler.kpa import KpaPolicy, KpaSpec
from autoscaler.ratio import RatioPolicy, SloTarget, ratio_step, slo_ratio
from autoscaler.replay import LinearStepModel
from autoscaler.slo_model import SloModelPolicy, predict, quantile_factor, replicas_needed

SLOS = [SloTarget("ttft", 90, 2.0), SloTarget("tpot", 90, 0.1)]
MODEL = LinearStepModel(
    {"base_ms": 12.0, "prefill_token_ms": 0.12, "decode_seq_ms": 0.15, "decode_context_token_ms": 0.00012}
)


# ---- expression evaluator -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "formula,env,want",
    [
        ("t1 + t2", {"t1": 2, "t2": 5}, 7),  # the KEDA docs' example
        ("a * 2 + b / 4", {"a": 3, "b": 8}, 8),
        ("-a ** 2", {"a": 3}, -9),
        ("(a + 1) * (b - 1)", {"a": 1, "b": 4}, 6),
        ("a > 3 ? a : 3", {"a": 5}, 5),
        ("a > 3 ? a : 3", {"a": 1}, 3),
        ("a >= 1 && b < 2 ? 1 : 0", {"a": 1, "b": 1}, 1),
        ("a == 1 || b == 1", {"a": 0, "b": 1}, 1),
        ("x ?? 7", {"x": None}, 7),
        ("x ?? 7", {"x": 2}, 2),
        ("min(a, b, 4) + max(a, b)", {"a": 1, "b": 9}, 10),
        ("abs(a - b) + ceil(1.2) + floor(1.8)", {"a": 1, "b": 4}, 6),
        ("a > 1 ? b > 1 ? 1 : 2 : 3", {"a": 2, "b": 0}, 2),
        ("not (a > 1)", {"a": 0}, 1),
    ],
)
def test_formulas(formula, env, want):
    assert evaluate(formula, env) == want


@pytest.mark.parametrize("bad", ["a +", "a b", "__import__('os')", "foo(1)", "a ; b", "(a", "1 +* 2"])
def test_bad_formulas_rejected(bad):
    with pytest.raises(ValueError):
        Formula(bad)({"a": 1, "b": 2})


def test_formula_names_and_nil_arithmetic():
    assert Formula("max(q, r) / 2 ?? s").names == {"q", "r", "s"}
    with pytest.raises(ValueError, match="nil"):
        evaluate("x + 1", {"x": None})


# ---- ratio law (llm-d) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,ready,s,want",
    [
        (4, 4, 0.45, 4),  # dead band
        (4, 4, 0.55, 4),  # the upper bound itself holds
        (4, 4, 1.1, 8),  # 4 + ceil(4 * (1.1 / 0.55 - 1))
        (8, 4, 1.1, 8),  # half still starting: the in-flight credit covers it
        (8, 6, 1.1, 12),  # 8 + ceil(8 * (1.1 * 0.75 / 0.55 - 1)) = 8 + 4
        (10, 10, 0.2, 5),  # 10 - floor(10 * (1 - 0.2 / 0.4))
        (10, 10, 0.0, 0),  # no traffic: all the way down (the caller clamps to min)
        (10, 10, 0.39, 10),  # 10 - floor(0.25) = 10
        (0, 0, 0.5, 1),
    ],
)
def test_ratio_step(n, ready, s, want):
    assert ratio_step(n, ready, s) == want


def test_slo_ratio_no_traffic_nan_and_clamp():
    obs = Observation(time=0, current_replicas=2, arrival_rate=3.0, ttft_p={90: 1.0}, tpot_p={90.0: 0.08})
    assert slo_ratio(obs, SLOS) == pytest.approx(0.8)
    obs.arrival_rate = 0.0
    assert slo_ratio(obs, SLOS) == 0.0
    obs.arrival_rate, obs.ttft_p, obs.tpot_p = 1.0, {90: math.nan}, {}
    assert slo_ratio(obs, SLOS) == 0.0
    obs.ttft_p = {90: 50.0}
    assert slo_ratio(obs, SLOS) == 2.0


def test_ratio_policy_smooths_over_window():
    p = RatioPolicy(SLOS, min_replicas=1, max_replicas=50, window=45)
    d = None
    for t, ttft in [(0, 0.9), (15, 0.9), (30, 0.9), (45, 4.0)]:
        d = p.decide(Observation(time=t, current_replicas=4, arrival_rate=1, ttft_p={90: ttft}))
    # window (0, 45]: samples at 15, 30, 45 -> (0.45 + 0.45 + 2.0) / 3
    assert "s=0.967" in d.reason and d.desired_replicas == 4 + math.ceil(4 * (0.9666666 / 0.55 - 1))


# ---- model-based SLO headroom --------------------------------------------------------------------


def test_quantile_factor():
    assert quantile_factor(0.9, 0.0) == 1.0
    assert quantile_factor(0.9, 1.0) == pytest.approx(-math.log(0.1))


def test_predictions_grow_with_load_and_saturate():
    light, heavy = predict(MODEL, 0.5, 1000, 200), predict(MODEL, 4.0, 1000, 200)
    assert light.ttft < heavy.ttft and light.tpot < heavy.tpot and light.batch < heavy.batch
    # Little's law holds at the fixed point
    assert heavy.batch == pytest.approx(4.0 * 200 * heavy.tpot, rel=1e-3)
    assert math.isinf(predict(MODEL, 50.0, 1000, 200).ttft)  # prefill alone needs > 100% of the time
    assert math.isinf(predict(MODEL, 4.0, 1000, 200, max_batch=8).tpot)  # batch cap exceeded


def test_replicas_needed_is_the_smallest_meeting_every_slo():
    n = replicas_needed(MODEL, 20.0, 1000, 200, SLOS, margin=0.15, hi=200)
    ok = [
        all(v <= s.seconds * 0.85 for v, s in zip((p.ttft, p.tpot), SLOS))
        for p in (predict(MODEL, 20.0 / k, 1000, 200) for k in (n - 1, n))
    ]
    assert ok == [False, True]
    assert replicas_needed(MODEL, 40.0, 1000, 200, SLOS, hi=200) > n  # twice the load needs more
    assert replicas_needed(MODEL, 0.0, 1000, 200, SLOS, lo=3) == 3


def test_linear_forecast():
    samples = [[t, 2.0 + 0.01 * t] for t in range(0, 300, 30)]
    assert linear_forecast(samples, 400) == pytest.approx(6.0)
    assert linear_forecast(samples[:2], 400) is None


def test_slo_model_looks_ahead_and_delays_scale_down():
    p = SloModelPolicy(
        SLOS,
        MODEL,
        min_replicas=1,
        max_replicas=100,
        startup_delay=120,
        forecast_window=300,
        scale_down_delay=120,
    )
    flat = SloModelPolicy(SLOS, MODEL, min_replicas=1, max_replicas=100, startup_delay=120)
    ramp = [(t, 2.0 + 0.05 * t) for t in range(0, 301, 30)]  # a rising load
    for t, rate in ramp:
        obs = dict(
            time=t, current_replicas=1, arrival_rate=rate, mean_prompt_tokens=1000, mean_output_tokens=200
        )
        d = p.decide(Observation(**obs))
    now_only = replicas_needed(MODEL, ramp[-1][1], 1000, 200, SLOS)
    assert d.desired_replicas > now_only  # provisioned for the rate two minutes ahead
    # scale-down waits for the delay window
    for t in (330, 360, 390):
        d = p.decide(
            Observation(
                time=t, current_replicas=10, arrival_rate=0.5, mean_prompt_tokens=1000, mean_output_tokens=200
            )
        )
    assert d.desired_replicas > 1
    d = p.decide(
        Observation(
            time=600, current_replicas=10, arrival_rate=0.5, mean_prompt_tokens=1000, mean_output_tokens=200
        )
    )
    assert d.desired_replicas == replicas_needed(MODEL, 0.5, 1000, 200, SLOS)
    # no length mix: no change
    assert flat.decide(Observation(time=0, current_replicas=7)).desired_replicas == 7


def test_backlog_adds_drain_rate():
    p = SloModelPolicy(SLOS, MODEL, drain_seconds=60)
    base = dict(time=0, current_replicas=1, arrival_rate=2.0, mean_prompt_tokens=1000, mean_output_tokens=200)
    assert p.demand(Observation(**base, num_waiting=120)) == pytest.approx(4.0)


@pytest.mark.parametrize(
    "rates, burst",
    [
        ([8.0, 8.2, 7.9, 8.1, 8.0, 8.3, 13.8], True),  # a 3x burst starting: the short trend catches it
        ([8.0, 8.2, 7.9, 8.1, 8.0, 8.3, 8.6], False),  # noise on a steady load: the long trend only
        ([8.0, 8.1, 8.2, 8.3, 8.4, 8.5, 8.6], False),  # a slow diurnal rise: the long trend only
        ([8.0, 11.0, 6.0, 10.0, 6.0, 7.0, 10.5], False),  # a jump, but inside this noisy load's spread
    ],
)
def test_short_trend_scales_ahead_of_a_burst_only(rates, burst):
    p = SloModelPolicy(SLOS, MODEL, startup_delay=120, polling_interval=30, trend_window=60, burst_rise=0.2)
    for i, rate in enumerate(rates):
        lengths = dict(mean_prompt_tokens=1000, mean_output_tokens=200)
        got = p.demand(Observation(time=30 * i, current_replicas=3, arrival_rate=rate, **lengths))
    now, last = 30 * (len(rates) - 1), [[30 * i, r] for i, r in enumerate(rates)]
    long_only = max(rates[-1], linear_forecast(last, now + 120))
    short = linear_forecast(last[-3:], now + 150)  # the lagging rate window: one polling interval more
    assert got == pytest.approx(short if burst else long_only)
    if burst:
        assert got > 1.6 * rates[-1]  # provisioned for the burst two minutes ahead, not the rate now
    assert json.loads(json.dumps(p.state_dict())) == p.state_dict()


def test_burst_gate_needs_the_rate_outside_the_long_trends_noise():
    noisy = [8.0, 11.0, 6.0, 10.0, 6.0, 7.0, 10.5]
    got = {}
    for z in (0.0, 4.0):
        p = SloModelPolicy(SLOS, MODEL, polling_interval=30, trend_window=60, burst_rise=0.2, burst_z=z)
        for i, rate in enumerate(noisy):
            lengths = dict(mean_prompt_tokens=1000, mean_output_tokens=200)
            got[z] = p.demand(Observation(time=30 * i, current_replicas=3, arrival_rate=rate, **lengths))
    short = linear_forecast([[30 * i, r] for i, r in enumerate(noisy)][-3:], 180 + 150)
    assert got[0.0] == pytest.approx(short) and short > 1.2 * noisy[-1]  # the rise alone passes burst_rise
    assert got[4.0] < got[0.0]  # ... but 10.5 is within 4 spreads of this load's trend: no burst


def _demand(p: SloModelPolicy, rates: list[float]) -> float:
    lengths = dict(mean_prompt_tokens=1000, mean_output_tokens=200)
    for i, rate in enumerate(rates):
        got = p.demand(Observation(time=30 * i, current_replicas=3, arrival_rate=rate, **lengths))
    return got


@pytest.mark.parametrize(
    "rates, slope, z, want",
    [
        # a burst's first rising sample: the last interval rises faster than the 60-s trend
        ([8.0, 8.2, 7.9, 8.1, 8.0, 8.3, 13.8], "trend", 4.0, "short"),
        ([8.0, 8.2, 7.9, 8.1, 8.0, 8.3, 13.8], "last", 4.0, "last"),
        # later in the ramp the trend can be the steeper one: the larger forecast wins
        ([8.0, 8.2, 7.9, 8.1, 8.0, 12.0, 13.0], "last", 0.0, "short"),
        # no burst (noise on a steady load): the slope choice changes nothing
        ([8.0, 8.2, 7.9, 8.1, 8.0, 8.3, 8.6], "last", 4.0, "long"),
    ],
)
def test_burst_slope_sizes_the_first_order(rates, slope, z, want):
    p = SloModelPolicy(SLOS, MODEL, polling_interval=30, trend_window=60, burst_z=z, burst_slope=slope)
    now, pts = 30 * (len(rates) - 1), [[30 * i, r] for i, r in enumerate(rates)]
    at = now + 120 + 30  # startup delay plus one polling interval
    expected = {
        "short": linear_forecast(pts[-3:], at),
        "last": rates[-1] + (rates[-1] - rates[-2]) / 30 * (at - now),
        "long": max(rates[-1], linear_forecast(pts, now + 120)),
    }[want]
    assert _demand(p, rates) == pytest.approx(expected)


def test_burst_slope_must_be_known():
    with pytest.raises(ValueError, match="burstSlope: must be trend, last or onset"):
        SloModelPolicy(SLOS, MODEL, burst_slope="steep")


@pytest.mark.parametrize(
    "rates, drop, want",
    [
        # a burst's tail: the 5-min trend still points up while the load falls
        ([2.0, 2.0, 2.0, 3.0, 4.5, 6.0, 6.0, 6.0, 6.0, 2.0], False, "long"),
        ([2.0, 2.0, 2.0, 3.0, 4.5, 6.0, 6.0, 6.0, 6.0, 2.0], True, "now"),
        # a rising load: nothing falls, the long trend's look-ahead stays
        ([2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5], True, "long"),
        # a dip above the long trend's fit is not a tail: the look-ahead stays
        ([2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 7.0, 6.8], True, "long"),
    ],
)
def test_drop_on_fall_provisions_for_the_rate_now(rates, drop, want):
    p = SloModelPolicy(SLOS, MODEL, polling_interval=30, trend_window=60, drop_on_fall=drop)
    now, pts = 30 * (len(rates) - 1), [[30 * i, r] for i, r in enumerate(rates)]
    expected = rates[-1] if want == "now" else max(rates[-1], linear_forecast(pts, now + 120))
    assert _demand(p, rates) == pytest.approx(expected)
    if want == "now":
        assert expected < linear_forecast(pts, now + 120)  # the long trend alone would over-order


# ---- KPA policy ------------------------------------------------------------------------------------


def test_kpa_policy_panics_on_a_burst():
    p = KpaPolicy(KpaSpec(target_value=10, max_scale_up_rate=10, max_scale_down_rate=2), max_replicas=100)
    for t in range(0, 60, 2):
        d = p.decide(Observation(time=t, current_replicas=2, num_running=20, num_waiting=0))
    assert d.desired_replicas == 2 and "stable" in d.reason
    d = p.decide(Observation(time=60, current_replicas=2, num_running=20, num_waiting=400))
    assert "panic" in d.reason and d.desired_replicas > 10
    assert json.loads(json.dumps(p.state_dict()))["panic_time"] == 60


# ---- KEDA details ------------------------------------------------------------------------------------


def _policy(**kw) -> KedaPolicy:
    return KedaPolicy(KedaConfig([Trigger("q", "sum(q)", threshold=10.0, activation_threshold=0.0)], **kw))


def test_keda_cooldown_counts_from_last_active_time():
    p = _policy(min_replica_count=0, cooldown_period=60)
    assert p.decide(Observation(time=0, current_replicas=0, metrics={"q": 5})).desired_replicas == 1
    assert p.decide(Observation(time=30, current_replicas=1, metrics={"q": 0})).desired_replicas == 1
    assert p.decide(Observation(time=60, current_replicas=1, metrics={"q": 0})).desired_replicas == 1
    assert p.decide(Observation(time=61, current_replicas=1, metrics={"q": 0})).desired_replicas == 0


def test_keda_initial_cooldown_when_never_active():
    p = _policy(min_replica_count=0, initial_cooldown_period=100, creation_time=0)
    # inside the initial cooldown KEDA does not deactivate; its HPA still goes down to max(min, 1)
    assert p.decide(Observation(time=50, current_replicas=3, metrics={"q": 0})).desired_replicas == 1
    assert p.decide(Observation(time=101, current_replicas=3, metrics={"q": 0})).desired_replicas == 0


@pytest.mark.parametrize(
    "behavior,current,want",
    [
        ("static", 2, 6),
        ("currentReplicas", 2, 2),
        ("currentReplicasIfHigher", 2, 6),
        ("currentReplicasIfHigher", 9, 9),
        ("currentReplicasIfLower", 2, 2),
        ("currentReplicasIfLower", 9, 6),
    ],
)
def test_fallback_behaviors(behavior, current, want):
    assert fallback_replicas(Fallback(3, 6, behavior), current) == want


def test_fallback_after_failure_threshold_consecutive_failures():
    p = _policy(min_replica_count=1, fallback=Fallback(failure_threshold=2, replicas=5))
    obs = [Observation(time=30 * i, current_replicas=3, errors={"q"}) for i in range(3)]
    got = [p.decide(o).desired_replicas for o in obs]
    assert got == [3, 3, 5]  # the 3rd consecutive failure is > failureThreshold: target x 5 fed to the HPA
    p.decide(Observation(time=90, current_replicas=5, metrics={"q": 50}))  # a success resets the count
    assert p.failures["q"] == 0


def test_keda_state_round_trips_through_json():
    p = _policy(min_replica_count=0)
    for t, v in [(0, 5), (30, 40), (60, 80)]:
        p.decide(Observation(time=t, current_replicas=max(1, int(v / 10)), metrics={"q": v}))
    q = _policy(min_replica_count=0)
    q.load_state_dict(json.loads(json.dumps(p.state_dict())))
    o = Observation(time=90, current_replicas=8, metrics={"q": 0})
    assert q.decide(o) == p.decide(o)


# ---- export ----------------------------------------------------------------------------------------


def _ia(policy: dict) -> dict:
    return {
        "apiVersion": "slopilot.dev/v1alpha1",
        "kind": "InferenceAutoscaler",
        "metadata": {"name": "m"},
        "spec": {
            "scaleTargetRef": {"name": "llama"},
            "minReplicas": 1,
            "maxReplicas": 20,
            "slo": {"ttft": {"seconds": 2.0}, "tpot": {"seconds": 0.1}},
            "policy": policy,
        },
    }


def test_export_ratio_law_matches_its_scale_up_step():
    spec = load_spec(_ia({"type": "ratio"}))
    doc, notes = to_scaled_object(spec)
    so = load_spec(doc)  # the export is itself a valid ScaledObject
    assert so.keda.modifiers.formula == "min(max(ttft / 2, tpot / 0.1), 2)" and notes
    keda, law = make_policy(so), make_policy(spec)
    for n, ready, ttft in [(4, 4, 2.2), (8, 6, 2.2), (5, 5, 3.0), (3, 1, 4.0)]:
        obs = dict(time=0, current_replicas=n, ready_replicas=ready)
        got = keda.decide(Observation(**obs, metrics={"ttft": ttft, "tpot": 0.05})).desired_replicas
        want = law.decide(Observation(**obs, arrival_rate=1, ttft_p={90: ttft}, tpot_p={90: 0.05}))
        assert got == want.desired_replicas
        keda, law = make_policy(so), make_policy(spec)


def test_export_keda_and_hpa_and_no_equivalent():
    trig = [{"type": "prometheus", "name": "w", "metadata": {"query": "sum(w)", "threshold": "4"}}]
    doc, _ = to_scaled_object(
        load_spec(_ia({"type": "keda", "keda": {"triggers": trig, "cooldownPeriod": 60}}))
    )
    assert doc["spec"]["cooldownPeriod"] == 60 and load_spec(doc).keda.triggers[0].name == "w"
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 60}}
    doc, _ = to_scaled_object(
        load_spec(_ia({"type": "hpa", "hpa": {"triggers": trig, "behavior": behavior}}))
    )
    assert doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == behavior
    for kind in ("sloModel", "kpa"):
        with pytest.raises(ValueError, match="no KEDA equivalent"):
            to_scaled_object(load_spec(_ia({"type": kind})))
