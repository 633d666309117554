"""Kubernetes HorizontalPodAutoscaler's sync, as the v1.33 controller does it.

Follows pkg/controller/podautoscaler/horizontal.go (Kubernetes v1.33): stabilization windows, the
rate limits of the behavior's policies (Percent scale-down limits are truncated) or the legacy
limits, and the controller's memory. Stored recommendations and scale events reuse one outdated
slot exactly like the controller does, so that ported upstream tables match entry for entry.
The per-metric proposals are autoscaler.hpa_replicas, the behavior's fields autoscaler.hpa_behavior.
Times are plain seconds from the caller; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoscaler.hpa_behavior import DEFAULT_DOWNSCALE_WINDOW, Behavior, ScalingRules
from autoscaler.hpa_replicas import INT32_MAX, combine_proposals

SCALE_UP_LIMIT_FACTOR = 2.0  # legacy path: at most max(2 x current, 4)
SCALE_UP_LIMIT_MINIMUM = 4.0


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
