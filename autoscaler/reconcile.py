"""The one reconcile step: observe, decide, clamp, apply.

The simulator's autoscaler process and the live controller both call `reconcile`, and `slopilot
replay` calls `decide`; they differ only in how they build the Observation (the metric source) and
in the ScaleTarget they hand in. An outage is never read as zero: when a metric failed and the
policy does not handle errors itself (KEDA's fallback does), the step holds the current count and
leaves the policy's state untouched. A target that fails raises ScaleError and the step reports it,
so the caller keeps the last applied state and retries on its next tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.screen import screen


class ScaleError(Exception):
    """The target refused or failed to take the new replica count."""


class ScaleTarget(Protocol):
    def scale(self, desired: int, reason: str) -> None:
        """Sets the target's desired replica count; raises ScaleError on failure."""


@dataclass(frozen=True)
class Step:
    decision: Decision  # what the policy said (or the hold, when metrics failed)
    desired: int  # the decision clamped to the policy's bounds, what was applied (or tried)
    error: str | None = None  # the target's error when the scale failed

    @property
    def applied(self) -> bool:
        return self.error is None


def clamp(desired: int, low: int, high: int) -> int:
    """Replicas within [low, high]; never negative."""
    return max(0, low, min(int(desired), high))


def decide(policy: Policy, obs: Observation) -> Decision:
    """The policy's decision, or a hold of the current count when a metric it needs failed (an
    out-of-range value counts as failed: autoscaler.screen, which moves it into obs.errors in place)."""
    screen(obs)
    if obs.errors and not policy.handles_errors:
        failed = ", ".join(sorted(obs.errors))
        return Decision(obs.current_replicas, obs.current_replicas > 0,
                        f"hold: metrics unavailable ({failed}), keeping {obs.current_replicas}")
    try:
        return policy.decide(obs)
    except (ArithmeticError, ValueError) as exc:  # a value the screen let through: a hold, not a crash
        return Decision(obs.current_replicas, obs.current_replicas > 0,
                        f"hold: policy failed on this tick's values ({type(exc).__name__}: {exc}), "
                        f"keeping {obs.current_replicas}")


def reconcile(policy: Policy, obs: Observation, target: ScaleTarget) -> Step:
    """One evaluation of `policy` on `obs`, applied to `target`."""
    decision = decide(policy, obs)
    desired = clamp(decision.desired_replicas, policy.min_replicas, policy.max_replicas)
    try:
        target.scale(desired, decision.reason)
    except ScaleError as exc:
        return Step(decision, desired, str(exc))
    return Step(decision, desired)
