"""Autoscaling policies: pure functions and small state objects (no I/O, no clocks of their own).

from autoscaler import Observation, load_spec, make_policy
policy = make_policy(load_spec(open("spec.yaml").read()), latency_model=model)
decision = policy.decide(Observation(time=t, current_replicas=n, metrics={"s0": 3.0}))

A new policy type is one module that calls register(PolicyType(...)) (see autoscaler.registry).
"""

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.registry import PolicyType, option, register
from autoscaler.slo_model import StepTimeModel
from autoscaler.spec import Spec, load_spec, make_policy

__all__ = ["Decision", "Observation", "Policy", "PolicyType", "Spec", "StepTimeModel", "load_spec",
           "make_policy", "option", "register"]
