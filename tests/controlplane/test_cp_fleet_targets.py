"""The scale-target interface through the one reconcile step, with the in-memory target."""

import pytest

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.reconcile import reconcile
from controlplane.fleet import LocalFleet
from controlplane.targets import MemoryTarget, Replicas, ScaleError, Target


class Wants(Policy):
    min_replicas, max_replicas = 1, 5

    def __init__(self, n: int):
        self.n = n

    def decide(self, obs: Observation) -> Decision:
        return Decision(self.n, True, f"wants {self.n}")


def test_memory_target_in_the_reconcile_step():
    target = MemoryTarget(2)
    assert isinstance(target, Target) and target.replicas() == Replicas(2, 2) and target.starting() == 0
    step = reconcile(Wants(9), Observation(0.0, 2), target)  # clamped to the policy's max
    assert step.applied and step.desired == 5 and target.replicas() == (5, 5)
    target.fail_next()
    step = reconcile(Wants(3), Observation(1.0, 5), target)
    assert not step.applied and "injected failure" in step.error and target.replicas() == (5, 5)
    step = reconcile(Wants(3), Observation(2.0, 5), target)  # the retry goes through
    assert step.applied and target.history == [(5, "wants 9"), (3, "wants 3")]


def test_bounds_and_unpacking():
    target = MemoryTarget(1, max_replicas=4)
    with pytest.raises(ScaleError, match=r"outside \[0, 4\]"):
        target.scale(5, "too many")
    current, ready = target.replicas()
    assert (current, ready) == (1, 1)
    assert issubclass(LocalFleet, Target)
