"""The kpa policy type: Knative's KPA (autoscaler.kpa), its options spelled as Knative's (percentages)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from autoscaler.kpa import KpaPolicy, KpaSpec
from autoscaler.registry import PolicyType, option, param_default, register

# Knative's spelling of KpaSpec: percentages of the stable window and of 1.0; KpaSpec holds the defaults
_K = {name: param_default(KpaSpec, name) for name in inspect.signature(KpaSpec).parameters}
NUM = "number"


@dataclass(frozen=True)
class KpaOptions:
    metric: str = option("metric", param_default(KpaPolicy, "metric"), {"enum": ["concurrency", "rps"]})
    target: float = option("target", 100.0,  # container-concurrency-target-default
                           {"type": NUM, "exclusiveMinimum": 0})
    target_utilization: float = option("targetUtilization", 0.7,  # container-concurrency-target-percentage
                                       {"type": NUM, "exclusiveMinimum": 0, "maximum": 1})
    stable_window: float = option("stableWindowSeconds", _K["stable_window"],
                                  {"type": NUM, "minimum": 6, "maximum": 3600})
    panic_window_percentage: float = option("panicWindowPercentage",
                                            100.0 * _K["panic_window"] / _K["stable_window"],
                                            {"type": NUM, "minimum": 1, "maximum": 100})
    panic_threshold_percentage: float = option("panicThresholdPercentage", 100.0 * _K["panic_threshold"],
                                               {"type": NUM, "minimum": 110})
    max_scale_up_rate: float = option("maxScaleUpRate", _K["max_scale_up_rate"],
                                      {"type": NUM, "exclusiveMinimum": 1})
    max_scale_down_rate: float = option("maxScaleDownRate", _K["max_scale_down_rate"],
                                        {"type": NUM, "exclusiveMinimum": 1})
    scale_down_delay: float = option("scaleDownDelaySeconds", _K["scale_down_delay"],
                                     {"type": NUM, "minimum": 0})


def build(spec, o: KpaOptions, latency_model) -> KpaPolicy:
    """Knative's percentages, turned into KpaSpec's fractions."""
    stable = float(o.stable_window)
    kspec = KpaSpec(
        target_value=float(o.target) * float(o.target_utilization),
        max_scale_up_rate=o.max_scale_up_rate,
        max_scale_down_rate=o.max_scale_down_rate,
        panic_threshold=o.panic_threshold_percentage / 100.0,
        stable_window=stable,
        panic_window=stable * o.panic_window_percentage / 100.0,
        scale_down_delay=o.scale_down_delay,
    )
    return KpaPolicy(kspec, o.metric, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                     polling_interval=spec.polling_interval)


KPA = register(PolicyType(
    "kpa", build, reads=("arrival_rate", "num_running", "num_waiting"), options=KpaOptions,
    meaning="Knative's KPA on concurrency or request rate",
    no_keda="Knative's stable/panic windows and rate limits have no KEDA/HPA counterpart",
))
