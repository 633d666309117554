"""The one reconcile step: observe, decide, clamp, apply.

The simulator's autoscaler process and the live controller both call `reconcile`; they differ only in
how they build the Observation (the metric source) and in the ScaleTarget they hand in. The step is
pure apart from `target.scale`: a target that fails raises ScaleError and the step reports it, so the
caller keeps the last applied state and retries on its next tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autoscaler.observation import Observation
from autoscaler.policy import Decision


class ScaleError(Exception):
    """The target refused or failed to take the new replica count."""


class ScaleTarget(Protocol):
    def scale(self, desired: int, reason: str) -> None:
        """Sets the target's desired replica count; raises ScaleError on failure."""


@dataclass(frozen=True)
class Step:
    decision: Decision  # what the policy said
    desired: int  # the decision clamped to the policy's bounds, what was applied (or tried)
    error: str | None = None  # the target's error when the scale failed

    @property
    def applied(self) -> bool:
        return self.error is None


def clamp(desired: int, low: int, high: int) -> int:
    """Replicas within [low, high]; never negative."""
    return max(0, low, min(int(desired), high))


def reconcile(policy, obs: Observation, target: ScaleTarget) -> Step:
    """One evaluation of `policy` on `obs`, applied to `target`."""
    decision = policy.decide(obs)
    desired = clamp(decision.desired_replicas, policy.min_replicas, policy.max_replicas)
    try:
        target.scale(desired, decision.reason)
    except ScaleError as exc:
        return Step(decision, desired, str(exc))
    return Step(decision, desired)
