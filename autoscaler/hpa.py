"""Kubernetes HorizontalPodAutoscaler arithmetic, as the v1.33 controller does it.

Follows pkg/controller/podautoscaler (replica_calculator.go and horizontal.go, Kubernetes v1.33):
metric values and targets are milli-quantities (ints), ratios are float64, proposals are ceil'ed,
Percent scale-down limits are truncated. Stored recommendations and scale events reuse one outdated
slot exactly like the controller does, so that ported upstream tables match entry for entry.
Times are plain seconds from the caller; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_TOLERANCE = 0.1
DEFAULT_DOWNSCALE_WINDOW = 300  # --horizontal-pod-autoscaler-downscale-stabilization
SCALE_UP_LIMIT_FACTOR = 2.0  # legacy path: at most max(2 x current, 4)
SCALE_UP_LIMIT_MINIMUM = 4.0
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def to_milli(value: float) -> int:
    """A float metric as a milli-quantity: 3 decimals, NaN/Inf/negative as 0 (what KEDA reports),
    capped at int64 (a quantity's range; value * 1000 would overflow a float past ~1.8e305)."""
    if value is None or math.isnan(value) or math.isinf(value) or value <= 0:
        return 0
    if value >= INT64_MAX / 1000:
        return INT64_MAX
    return int(round(float(f"{value:.3f}") * 1000))


@dataclass(frozen=True)
class Tolerances:
    down: float = DEFAULT_TOLERANCE
    up: float = DEFAULT_TOLERANCE

    def within(self, ratio: float) -> bool:
        return (1.0 - self.down) <= ratio <= (1.0 + self.up)


def _ratio(num: float, den: float) -> float:
    if den == 0:
        return math.nan if num == 0 else math.inf
    return num / den


def _ceil32(x: float) -> int:
    if math.isnan(x):
        return 0
    return INT32_MAX if x > INT32_MAX else int(math.ceil(x))


# ---- replica calculator: one proposal per metric ---------------------------------------------


def value_replicas(current: int, ready: int, usage_milli: int, target_milli: int, tol: Tolerances) -> int:
    """External or Object metric with a Value target (getUsageRatioReplicaCount)."""
    ratio = _ratio(usage_milli, target_milli)
    if current == 0:
        return _ceil32(ratio)  # scale from zero: ignore tolerance and readiness
    if tol.within(ratio):
        return current
    return _ceil32(ratio * ready)


def average_value_replicas(
    status_replicas: int, usage_milli: int, target_per_pod_milli: int, tol: Tolerances
) -> int:
    """External or Object metric with an AverageValue target (the per-pod form KEDA uses)."""
    ratio = _ratio(usage_milli, target_per_pod_milli * status_replicas)
    if tol.within(ratio):
        return status_replicas
    return _ceil32(usage_milli / target_per_pod_milli)


@dataclass
class PodSample:
    value_milli: int | None  # None = no metric returned for this pod (missing)
    ready: bool = True
    request_milli: int = 0  # resource request, for Utilization targets only


def _usage_ratio_pods(samples: list[PodSample], target: int) -> tuple[float, int]:
    usage = sum(s.value_milli for s in samples) // len(samples)  # int64 average, truncated
    return usage / target, usage


def _utilization_ratio(samples: list[PodSample], target_pct: int) -> tuple[float, int]:
    total = sum(s.value_milli for s in samples)
    requests = sum(s.request_milli for s in samples)
    utilization = (total * 100) // requests
    return utilization / target_pct, utilization


def pods_replicas(
    current: int, pods: list[PodSample], target: int, tol: Tolerances, utilization: bool = False
) -> int:
    """Pods metric / Resource AverageValue (or Utilization when utilization=True): calcPlainMetricReplicas
    and GetResourceReplicas, with the missing-pod and unready-pod corrections."""
    ratio_fn = _utilization_ratio if utilization else _usage_ratio_pods
    ready = [p for p in pods if p.ready and p.value_milli is not None]
    unready = [p for p in pods if not p.ready and p.value_milli is not None]
    missing = [p for p in pods if p.value_milli is None]
    if not ready:
        raise ValueError("did not receive metrics for targeted pods (pods might be unready)")
    ratio, _ = ratio_fn(ready, target)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        return current if tol.within(ratio) else _ceil32(ratio * len(ready))
    samples = list(ready)
    if missing:
        if ratio < 1.0:  # scale-down: missing pods count as exactly at target
            fill = max(100, target) if utilization else target
            samples += [
                PodSample(p.request_milli * fill // 100 if utilization else fill, True, p.request_milli)
                for p in missing
            ]
        elif ratio > 1.0:  # scale-up: missing pods count as idle
            samples += [PodSample(0, True, p.request_milli) for p in missing]
    if scale_up_with_unready:
        samples += [PodSample(0, True, p.request_milli) for p in unready]
    new_ratio, _ = ratio_fn(samples, target)
    if tol.within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current  # too small a change, or the correction flipped the direction
    proposal = _ceil32(new_ratio * len(samples))
    if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
        return current
    return proposal


def combine_proposals(current: int, proposals: list[int | None]) -> int | None:
    """Several metrics: the largest proposal; None (do not scale) when every metric is invalid, or when
    some are invalid and the largest valid one would scale down (computeReplicasForMetrics)."""
    valid = [p for p in proposals if p is not None]
    invalid = len(proposals) - len(valid)
    if not valid:
        return None
    best = max(valid)
    if invalid and best < current:
        return None
    return best


# ---- behavior: stabilization windows and rate-limiting policies ------------------------------


@dataclass
class ScalingPolicy:
    type: str  # "Pods" or "Percent"
    value: int
    period_seconds: int


@dataclass
class ScalingRules:
    stabilization_window_seconds: int | None = None
    select_policy: str = "Max"  # Max, Min or Disabled
    policies: list[ScalingPolicy] = field(default_factory=list)
    tolerance: float | None = None  # behavior.scaleUp/scaleDown.tolerance (v1.33, alpha)


@dataclass
class Behavior:
    scale_up: ScalingRules
    scale_down: ScalingRules


def default_scale_up(rules: ScalingRules | None = None) -> ScalingRules:
    """GenerateHPAScaleUpRules: unset fields get window 0, Max, Pods 4/15s and Percent 100/15s."""
    r = rules or ScalingRules()
    return ScalingRules(
        0 if r.stabilization_window_seconds is None else r.stabilization_window_seconds,
        r.select_policy or "Max",
        r.policies or [ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)],
        r.tolerance,
    )


def default_scale_down(
    rules: ScalingRules | None = None, window: int = DEFAULT_DOWNSCALE_WINDOW
) -> ScalingRules:
    """GenerateHPAScaleDownRules: window from the controller flag, Max, Percent 100/15s."""
    r = rules or ScalingRules()
    return ScalingRules(
        window if r.stabilization_window_seconds is None else r.stabilization_window_seconds,
        r.select_policy or "Max",
        r.policies or [ScalingPolicy("Percent", 100, 15)],
        r.tolerance,
    )


def default_behavior(up: ScalingRules | None = None, down: ScalingRules | None = None) -> Behavior:
    return Behavior(default_scale_up(up), default_scale_down(down))


@dataclass
class HpaState:
    """The controller's memory for one HPA: [time, replicas] recommendations and [time, change, outdated]
    scale events. Plain lists so that state_dict() is JSON as-is."""

    recommendations: list[list] = field(default_factory=list)
    scale_up_events: list[list] = field(default_factory=list)
    scale_down_events: list[list] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "recommendations": self.recommendations,
            "scale_up_events": self.scale_up_events,
            "scale_down_events": self.scale_down_events,
        }

    @classmethod
    def from_dict(cls, d: dict) -> HpaState:
        return cls(
            [list(x) for x in d.get("recommendations", [])],
            [list(x) for x in d.get("scale_up_events", [])],
            [list(x) for x in d.get("scale_down_events", [])],
        )


def _record(recs: list[list], old_index: int | None, now: float, desired: int) -> None:
    if old_index is not None:
        recs[old_index] = [now, desired]
    else:
        recs.append([now, desired])


def stabilize_legacy(
    state: HpaState, now: float, desired: int, window: float = DEFAULT_DOWNSCALE_WINDOW
) -> int:
    """No behavior: the highest recommendation of the last `window` seconds (stabilizeRecommendation)."""
    best, old = desired, None
    cutoff = now - window
    for i, (t, rec) in enumerate(state.recommendations):
        if t < cutoff:
            old = i
        elif rec > best:
            best = rec
    _record(state.recommendations, old, now, desired)
    return best


def stabilize_with_behavior(
    state: HpaState, now: float, current: int, desired: int, behavior: Behavior
) -> int:
    """stabilizeRecommendationWithBehaviors: clamp current into [min over up window, max over down window]."""
    up_cut = now - (behavior.scale_up.stabilization_window_seconds or 0)
    down_cut = now - (behavior.scale_down.stabilization_window_seconds or 0)
    up_rec = down_rec = desired
    old = None
    for i, (t, rec) in enumerate(state.recommendations):
        if t > up_cut:
            up_rec = min(rec, up_rec)
        if t > down_cut:
            down_rec = max(rec, down_rec)
        if t < up_cut and t < down_cut:
            old = i
    result = max(current, up_rec)
    result = min(result, down_rec)
    _record(state.recommendations, old, now, desired)
    return result


def replicas_changed_in_period(events: list[list], now: float, period: float) -> int:
    return sum(e[1] for e in events if e[0] > now - period)


def scale_up_limit(
    current: int, up_events: list[list], down_events: list[list], rules: ScalingRules, now: float
) -> int:
    if rules.select_policy == "Disabled":
        return current
    pick, result = (min, INT32_MAX) if rules.select_policy == "Min" else (max, -INT32_MAX - 1)
    for p in rules.policies:
        start = (
            current
            - replicas_changed_in_period(up_events, now, p.period_seconds)
            + replicas_changed_in_period(down_events, now, p.period_seconds)
        )
        if p.type == "Pods":
            proposed = start + p.value
        else:  # rounded up, or a small percentage could never add a replica
            proposed = int(math.ceil(start * (1 + p.value / 100)))
        result = pick(result, proposed)
    return result


def scale_down_limit(
    current: int, up_events: list[list], down_events: list[list], rules: ScalingRules, now: float
) -> int:
    if rules.select_policy == "Disabled":
        return current
    # for scale-down the largest change is the smallest count
    pick, result = (max, -INT32_MAX - 1) if rules.select_policy == "Min" else (min, INT32_MAX)
    for p in rules.policies:
        start = (
            current
            - replicas_changed_in_period(up_events, now, p.period_seconds)
            + replicas_changed_in_period(down_events, now, p.period_seconds)
        )
        if p.type == "Pods":
            proposed = start - p.value
        else:
            proposed = int(start * (1 - p.value / 100))  # Go's int32() truncates toward zero
        result = pick(result, proposed)
    return result


def rate_limit(
    state: HpaState,
    now: float,
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    behavior: Behavior,
) -> tuple[int, str]:
    """convertDesiredReplicasWithBehaviorRate: returns (replicas, condition reason)."""
    if desired > current:
        limit = max(
            scale_up_limit(current, state.scale_up_events, state.scale_down_events, behavior.scale_up, now),
            current,
        )
        if max_replicas > limit:
            allowed, reason = limit, "ScaleUpLimit"
        else:
            allowed, reason = max_replicas, "TooManyReplicas"
        if desired > allowed:
            return allowed, reason
    elif desired < current:
        limit = min(
            scale_down_limit(
                current, state.scale_up_events, state.scale_down_events, behavior.scale_down, now
            ),
            current,
        )
        if min_replicas < limit:
            allowed, reason = limit, "ScaleDownLimit"
        else:
            allowed, reason = min_replicas, "TooFewReplicas"
        if desired < allowed:
            return allowed, reason
    return desired, "DesiredWithinRange"


def legacy_limit(current: int, desired: int, min_replicas: int, max_replicas: int) -> tuple[int, str]:
    """convertDesiredReplicasWithRules: clamp to [min, min(max, max(2 x current, 4))]."""
    up_limit = int(max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM))
    if max_replicas > up_limit:
        allowed, reason = up_limit, "ScaleUpLimit"
    else:
        allowed, reason = max_replicas, "TooManyReplicas"
    if desired < min_replicas:
        return min_replicas, "TooFewReplicas"
    if desired > allowed:
        return allowed, reason
    return desired, "DesiredWithinRange"


def _longest_period(rules: ScalingRules) -> int:
    return max((p.period_seconds for p in rules.policies), default=0)


def store_scale_event(state: HpaState, now: float, behavior: Behavior | None, prev: int, new: int) -> None:
    """storeScaleEvent: mark events older than the longest period outdated, reuse the last outdated slot."""
    if behavior is None:
        return
    if new > prev:
        events, change, rules = state.scale_up_events, new - prev, behavior.scale_up
    else:
        events, change, rules = state.scale_down_events, prev - new, behavior.scale_down
    cutoff = now - _longest_period(rules)
    old = None
    for i, e in enumerate(events):
        if e[0] < cutoff:
            e[2] = True
        if e[2]:
            old = i
    if old is not None:
        events[old] = [now, change, False]
    else:
        events.append([now, change, False])


def reconcile(
    state: HpaState,
    now: float,
    current: int,
    min_replicas: int,
    max_replicas: int,
    proposals: list[int | None],
    behavior: Behavior | None,
    downscale_window: float = DEFAULT_DOWNSCALE_WINDOW,
) -> tuple[int, str]:
    """One HPA sync (reconcileAutoscaler) from the per-metric proposals; returns (replicas, reason)."""
    if current == 0 and min_replicas != 0:
        return 0, "ScalingDisabled"
    if current > max_replicas:
        desired, reason = max_replicas, "TooManyReplicas"
    elif current < min_replicas:
        desired, reason = min_replicas, "TooFewReplicas"
    else:
        metric_desired = combine_proposals(current, proposals)
        if metric_desired is None:
            return current, "FailedGetMetrics"
        if behavior is None:
            stabilized = stabilize_legacy(state, now, metric_desired, downscale_window)
            desired, reason = legacy_limit(current, stabilized, min_replicas, max_replicas)
        else:
            stabilized = stabilize_with_behavior(state, now, current, metric_desired, behavior)
            desired, reason = rate_limit(
                state, now, current, stabilized, min_replicas, max_replicas, behavior
            )
    if desired != current:
        store_scale_event(state, now, behavior, current, desired)
    return desired, reason
