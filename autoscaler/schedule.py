"""Predetermined replica counts: a constant pool, or a time schedule.

They read only the clock and the current count from the Observation, so a planner can compare a
fixed or scheduled fleet with the reactive policies through the same reconcile step.
"""

from __future__ import annotations

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy


class FixedPolicy(Policy):
    """Keeps the pool at a constant size."""

    def __init__(self, replicas: int, polling_interval: float = 3600.0):
        self.replicas = replicas
        self.min_replicas = self.max_replicas = replicas
        self.polling_interval = polling_interval

    def decide(self, obs: Observation) -> Decision:
        return Decision(self.replicas, self.replicas > 0, f"fixed at {self.replicas}")


class SchedulePolicy(Policy):
    """A time schedule [(at_s, replicas)]; before the first entry the pool keeps its initial size."""

    def __init__(self, steps: list[tuple[float, int]], initial: int, polling_interval: float = 1.0):
        self.steps = steps
        self.initial = initial
        self.polling_interval = polling_interval
        self.min_replicas = 0
        self.max_replicas = max([initial] + [n for _, n in steps])

    def decide(self, obs: Observation) -> Decision:
        n = self.initial
        for at, replicas in self.steps:
            if obs.time >= at:
                n = replicas
        return Decision(n, n > 0, f"schedule: {n} at t={obs.time:g}s")
