"""Kubernetes HPA's behavior field: scaling rules per direction, their policies and the defaults the
v1.33 API fills in (GenerateHPAScaleUpRules, GenerateHPAScaleDownRules)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_DOWNSCALE_WINDOW = 300  # --horizontal-pod-autoscaler-downscale-stabilization


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
