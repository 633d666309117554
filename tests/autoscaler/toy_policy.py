"""A toy policy type, declared in this one module and nowhere else: one replica per `queuePerReplica`
waiting requests (plus one). Importing the module registers it; tests/autoscaler/test_policy_registry.py shows
the schema, the CRD, the reference page, replay, simulate and control --once all take it, and
tests/slopilot/test_plugins.py the same commands in separate processes (`slopilot --plugin MODULE`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.registry import PolicyType, option, register


@dataclass(frozen=True)
class ToyOptions:
    per_replica: float = option("queuePerReplica", 4.0, {"type": "number", "exclusiveMinimum": 0},
                                "waiting requests one replica absorbs")


class ToyQueuePolicy(Policy):
    def __init__(self, per_replica: float, min_replicas: int, max_replicas: int, polling_interval: float):
        self.per_replica = per_replica
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.polling_interval = polling_interval

    def decide(self, obs: Observation) -> Decision:
        if obs.num_waiting is None:
            return Decision(obs.current_replicas, False, "toyQueue: no queue, no change")
        want = 1 + math.floor(obs.num_waiting / self.per_replica)
        desired = min(max(want, self.min_replicas), self.max_replicas)
        return Decision(desired, obs.num_waiting > 0, f"toyQueue: {obs.num_waiting:g} waiting -> {want}")


def build(spec, options: ToyOptions, latency_model) -> ToyQueuePolicy:
    return ToyQueuePolicy(options.per_replica, spec.min_replicas, spec.max_replicas, spec.polling_interval)


TOY = register(PolicyType("toyQueue", build, reads=("num_waiting",), options=ToyOptions,
                          meaning="a toy: one replica per queuePerReplica waiting requests"))
