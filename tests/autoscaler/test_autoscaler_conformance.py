"""Conformance tables ported as data from Kubernetes, KEDA and Knative (tests/data/autoscaler/*.yaml).

Every case names its upstream test; the inputs and expected outputs are theirs, the code is ours.
"""

from pathlib import Path

import pytest
import yaml

from autoscaler import hpa, hpa_behavior, hpa_replicas
from autoscaler.hpa_behavior import Behavior, ScalingRules
from autoscaler.hpa_replicas import PodSample
from autoscaler.keda import KedaConfig, KedaPolicy, Trigger
from autoscaler.kpa import KpaSpec, KpaState, kpa_scale
from autoscaler.observation import Observation
from autoscaler.prometheus import QueryError, value_from_response

DATA = Path(__file__).resolve().parents[1] / "data" / "autoscaler"
NOW = 10_000.0  # any clock; ages in the tables are relative to it


def load(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text())


def cases(doc: dict, key: str = "name"):
    return pytest.mark.parametrize(
        "case", doc["cases"], ids=[str(c.get(key, c.get("test"))) for c in doc["cases"]]
    )


def rules(r: list | None) -> hpa_behavior.ScalingRules | None:
    """The upstream generateScalingRules(pods, podsPeriod, percent, percentPeriod, window) helper."""
    if r is None:
        return None
    pods, pods_period, percent, percent_period, window = r
    policies = []
    if pods:
        policies.append(hpa_behavior.ScalingPolicy("Pods", pods, pods_period))
    if percent:
        policies.append(hpa_behavior.ScalingPolicy("Percent", percent, percent_period))
    return hpa_behavior.ScalingRules(window, "Max", policies)


def events(raw: list | None) -> list[list]:
    return [[NOW - age, change, False] for age, change in (raw or [])]


SCALING = load("k8s_scaling_rules.yaml")
NORMALIZE = load("k8s_normalize.yaml")
CALC = load("k8s_replica_calculator.yaml")
RECONCILE = load("k8s_reconcile.yaml")
KEDA = load("keda.yaml")
KNATIVE = load("knative.yaml")


@cases(SCALING)
def test_k8s_scaling_with_rules(case):
    state = hpa.HpaState(
        scale_up_events=events(case.get("up_events")), scale_down_events=events(case.get("down_events"))
    )
    behavior = hpa_behavior.default_behavior(rules(case.get("up")), rules(case.get("down")))
    got, condition = hpa.rate_limit(
        state, NOW, case["current"], case["desired"], case["min"], case["max"], behavior
    )
    assert (got, condition) == (case["expected"], case["condition"]), SCALING["upstream"]


@cases(NORMALIZE["legacy"])
def test_k8s_normalize_desired_replicas(case):
    state = hpa.HpaState(recommendations=[[NOW - age, rec] for age, rec in case["recs"]])
    assert hpa.stabilize_legacy(state, NOW, case["desired"], 300) == case["expected"]
    assert len(state.recommendations) == case["log_length"]


@cases(NORMALIZE["behavior"])
def test_k8s_normalize_desired_replicas_with_behavior(case):
    state = hpa.HpaState(recommendations=[[NOW - age, rec] for age, rec in case["recs"]])
    behavior = Behavior(ScalingRules(case["up_window"]), ScalingRules(case["down_window"]))
    got = hpa.stabilize_with_behavior(state, NOW, case["current"], case["desired"], behavior)
    assert got == case["expected"]
    if "expected_recs" in case:
        assert [r[1] for r in state.recommendations] == case["expected_recs"]


@cases(NORMALIZE["store_events"])
def test_k8s_store_scale_events(case):
    r = rules(case["rules"])
    behavior = None if r is None else hpa_behavior.Behavior(r, r)
    for direction in ("up", "down"):
        state = hpa.HpaState()
        evs = [[NOW - age, change, False] for age, change in case["prev"]]
        setattr(state, f"scale_{direction}_events", evs)
        assert hpa.replicas_changed_in_period(evs, NOW, 60) == case["expected_change"]
        new = 10 + case["change"] if direction == "up" else 10 - case["change"]
        hpa.store_scale_event(state, NOW, behavior, 10, new)
        got = [[e[1], e[2]] for e in getattr(state, f"scale_{direction}_events")]
        assert got == case["new_events"], direction


def _pods(case) -> list[hpa_replicas.PodSample]:
    requests = case.get("requests") or [0] * len(case["levels"])
    unready = set(case.get("unready", []))
    return [PodSample(v, i not in unready, r) for i, (v, r) in enumerate(zip(case["levels"], requests))]


def _proposal(case) -> int:
    down, up = case.get("tolerances", [0.1, 0.1])
    tol = hpa_replicas.Tolerances(down=down, up=up)
    kind = case["kind"]
    if kind in ("external", "object"):
        return hpa_replicas.value_replicas(case["current"], case["ready"], case["usage"], case["target"], tol)
    if kind in ("external_avg", "object_avg"):
        return hpa_replicas.average_value_replicas(case["current"], case["usage"], case["target"], tol)
    return hpa_replicas.pods_replicas(
        case["current"], _pods(case), case["target"], tol, utilization=kind == "utilization"
    )


@cases(CALC, key="test")
def test_k8s_replica_calculator(case):
    assert _proposal(case) == case["expected"], case["test"]


@cases(RECONCILE, key="test")
def test_k8s_reconcile_with_invalid_metrics(case):
    proposals = [
        None if m["kind"] == "invalid" else _proposal({**m, "current": case["current"]})
        for m in case["metrics"]
    ]
    got, _ = hpa.reconcile(hpa.HpaState(), NOW, case["current"], case["min"], case["max"], proposals, None)
    assert got == case["expected"]


def _keda(case) -> KedaPolicy:
    cfg = KedaConfig(
        [Trigger("s0", "q", threshold=10.0)],
        min_replica_count=case["min"],
        idle_replica_count=case.get("idle"),
    )
    return KedaPolicy(cfg)


@cases(KEDA["scaled_objects"], key="test")
def test_keda_request_scale(case):
    policy = _keda(case)
    # the executor step alone (what RequestScale sets), then the whole tick through decide()
    step = policy._keda_step(NOW, case["current"], case["active"], False)
    assert step is not None and step[0] == case["expected"]
    policy = _keda(case)
    value = 25.0 if case["active"] else 0.0
    d = policy.decide(Observation(time=NOW, current_replicas=case["current"], metrics={"s0": value}))
    assert (d.desired_replicas, d.active) == (case["expected"], case["active"])


@cases(KEDA["prometheus"])
def test_keda_prometheus_null_nan_inf(case):
    if case.get("error"):
        with pytest.raises(QueryError):
            value_from_response(case["body"], case["status"], case["ignore_null_values"])
    else:
        assert (
            value_from_response(case["body"], case["status"], case["ignore_null_values"]) == case["expected"]
        )


def _kpa_spec(case) -> KpaSpec:
    d = KNATIVE["defaults"]
    return KpaSpec(
        target_value=case["target"],
        max_scale_up_rate=case.get("max_scale_up_rate", d["max_scale_up_rate"]),
        max_scale_down_rate=case.get("max_scale_down_rate", d["max_scale_down_rate"]),
        panic_threshold=d["panic_threshold"],
        stable_window=d["stable_window"],
        reachable=case.get("reachable", True),
    )


@cases(KNATIVE["scale"], key="label")
def test_knative_autoscaler_scale(case):
    state = KpaState(
        NOW - case["panic_ago"] if "panic_ago" in case else None,
        case.get("max_panic_pods", KNATIVE["defaults"]["max_panic_pods"]),
    )
    got = kpa_scale(_kpa_spec(case), state, case["ready"], case["stable"], case["panic"], NOW)
    assert got == case["want"]


@cases(KNATIVE["sequences"], key="test")
def test_knative_sequences(case):
    spec, state = _kpa_spec(case), KpaState(None, KNATIVE["defaults"]["max_panic_pods"])
    for t, ready, stable, panic, want in case["steps"]:
        assert kpa_scale(spec, state, ready, stable, panic, NOW + t) == want, (t, ready, stable, panic)


def test_at_least_40_ported_cases():
    n = sum(
        len(d["cases"])
        for d in (
            SCALING,
            NORMALIZE["legacy"],
            NORMALIZE["behavior"],
            NORMALIZE["store_events"],
            CALC,
            RECONCILE,
            KEDA["scaled_objects"],
            KEDA["prometheus"],
            KNATIVE["scale"],
            KNATIVE["sequences"],
        )
    )
    assert n >= 40
