"""Formula hardening: every evaluation failure is a FormulaError, never a silent 0 or a crash, the cost
of a formula is bounded, and KEDA's policy counts a failed formula toward the fallback."""

import time

import pytest

from autoscaler.expr import MAX_CHARS, MAX_NESTING, Formula, FormulaError, evaluate
from autoscaler.keda import FORMULA, Fallback, KedaConfig, KedaPolicy, ScalingModifiers, Trigger
from autoscaler.observation import Observation
from autoscaler.replay import replay
from autoscaler.series import read_series
from autoscaler.spec import load_spec, make_policy

ENV = {"a": 9.0, "b": 0.0, "n": None, "big": 1e300}


@pytest.mark.parametrize(
    "formula,message",
    [
        ("a / b", "division by zero (9 / 0)"),
        ("a % b", "division by zero"),
        ("b ** -1", "division by zero"),
        ("10 ** 400", "overflow"),
        ("big * big", "overflow"),
        ("a ** a ** a ** a", "overflow"),
        ("big + big + big * 1e10", "overflow"),
        ("ceil(big * 1e10)", "overflow"),
        ("(-8) ** 0.5", "(-8) ** 0.5 has no real value"),
        ("(0 - a) ** (1 / 3)", "has no real value"),
        ("n + 1", "nil value in arithmetic"),
        ("n", "the result is nil"),
        ("nil ?? nil", "the result is nil"),
        ("a > 1 ? n : 2", "the result is nil"),
        ("max(a, n)", "nil value"),
        ("c + 1", "unknown name 'c'"),
    ],
)
def test_evaluation_errors_are_formula_errors(formula, message):
    with pytest.raises(FormulaError, match="formula .*" + _escape(message)):
        Formula(formula)(ENV)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_are_errors_never_zero(value):
    with pytest.raises(FormulaError, match="not a finite number"):
        evaluate("x * 0", {"x": value})


@pytest.mark.parametrize(
    "formula,message",
    [
        ("min()", "min() takes at least 1 argument(s), got 0"),
        ("max()", "max() takes at least 1 argument(s)"),
        ("abs(1, 2)", "abs() takes 1 argument(s), got 2"),
        ("ceil()", "ceil() takes 1 argument(s), got 0"),
        ("round(1, 2)", "round() takes 1 argument(s)"),
        ("pow(2, 3)", "unknown function 'pow'"),
        ("(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1), f"nested more than {MAX_NESTING}"),
        ("-" * 500 + "1", "nested more than"),
        ("!" * 200 + "a", "nested more than"),
        ("a ? " * 40 + "1" + " : 2" * 40, "nested more than"),
        ("min(" * 40 + "1" + ")" * 40, "nested more than"),
        ("a + " * 400 + "a", f"more than the limit of {MAX_CHARS}"),
        ("1e999", "too large"),
        ("a $ b", "unexpected character"),
    ],
)
def test_parse_errors_are_formula_errors(formula, message):
    with pytest.raises(FormulaError, match=_escape(message)):
        Formula(formula)


def test_non_text_formula_is_refused():
    with pytest.raises(FormulaError, match="must be text"):
        Formula(12)


@pytest.mark.parametrize(
    "formula,want",
    [
        ("min(a)", 9),
        ("max(1, 2, 3)", 3),
        ("round(2.4)", 2),
        ("a == 9", 1),
        ("n ?? n ?? 4", 4),
        ("a + a - a * 2 + a / 3", 3),
        ("((((a))))", 9),
        ("b > 0 ? a / b : 0", 0),  # the untaken branch is never evaluated
    ],
)
def test_valid_formulas_still_evaluate(formula, want):
    assert evaluate(formula, ENV) == want


def test_evaluation_cost_is_bounded():
    # the longest and the deepest formulas the limits allow evaluate in well under a millisecond each
    flat = Formula(" + ".join(["a"] * ((MAX_CHARS - 1) // 4)))
    deep = Formula("(" * (MAX_NESTING - 1) + "a" + ")" * (MAX_NESTING - 1))
    calls = Formula("max(" + ", ".join(["a"] * ((MAX_CHARS - 6) // 3)) + ")")
    for f in (flat, deep, calls):
        start = time.perf_counter()
        for _ in range(100):
            f({"a": 1.0})
        assert (time.perf_counter() - start) / 100 < 0.005


# ---- the policy: a failed formula is a failed metric --------------------------------------------


def _policy(formula: str, fallback: Fallback | None = None) -> KedaPolicy:
    triggers = [Trigger("a", "sum(a)", 10.0), Trigger("b", "sum(b)", 10.0)]
    return KedaPolicy(KedaConfig(triggers, min_replica_count=1, max_replica_count=20, fallback=fallback,
                                 modifiers=ScalingModifiers(formula, target=5.0)))


@pytest.mark.parametrize("formula", ["a / b", "a ** 1000", "(0 - a) ** 0.5", "b > 0 ? a : nil"])
def test_failed_formula_holds_without_fallback(formula):
    p = _policy(formula)
    d = p.decide(Observation(time=0, current_replicas=3, metrics={"a": 40.0, "b": 0.0}))
    assert d.desired_replicas == 3 and not d.active  # never read as 0 (which would scale down)
    assert "formula" in d.reason and "errors:" in d.reason
    assert p.failures[FORMULA] == 1


@pytest.mark.parametrize("formula", ["a / b", "a ** (1000 - b * 500)", "(b * 40 - a) ** 0.5"])
def test_failed_formula_counts_toward_the_fallback(formula):
    p = _policy(formula, Fallback(failure_threshold=2, replicas=7))
    obs = [Observation(time=15 * i, current_replicas=4, metrics={"a": 40.0, "b": 0.0}) for i in range(4)]
    got = [p.decide(o).desired_replicas for o in obs]
    assert got == [4, 4, 7, 7]  # the third consecutive failure is past failureThreshold 2
    d = p.decide(Observation(time=60, current_replicas=7, metrics={"a": 40.0, "b": 2.0}))
    assert p.failures[FORMULA] == 0 and "errors" not in d.reason  # a good evaluation resets the count


def test_replayed_formula_error_is_reported_in_the_decision():
    spec = load_spec(
        """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: ratio}
spec:
  scaleTargetRef: {name: x}
  pollingInterval: 15
  minReplicaCount: 1
  maxReplicaCount: 10
  fallback: {failureThreshold: 1, replicas: 6}
  advanced:
    scalingModifiers: {formula: "waiting / running", target: "1"}
  triggers:
  - {type: prometheus, name: waiting, metadata: {query: sum(w), threshold: "1"}}
  - {type: prometheus, name: running, metadata: {query: sum(r), threshold: "1"}}
"""
    )
    rows, _ = read_series("time,waiting,running\n0,4,2\n15,4,0\n30,4,0\n45,4,2\n", ["waiting", "running"])
    out = replay(make_policy(spec), rows, 15.0, 1)
    reasons = [d.reason for _, d in out]
    assert [d.desired_replicas for _, d in out] == [2, 2, 4, 6]  # the fallback, at the HPA's up rate
    assert "division by zero (4 / 0)" in reasons[1] and "division by zero" in reasons[2]
    assert "errors" not in reasons[3]
