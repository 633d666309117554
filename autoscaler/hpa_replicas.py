"""Kubernetes HPA's replica calculator, as the v1.33 controller does it: one proposal per metric.

Follows pkg/controller/podautoscaler/replica_calculator.go (Kubernetes v1.33): metric values and
targets are milli-quantities (ints), ratios are float64, proposals are ceil'ed; several metrics
combine into the largest proposal (computeReplicasForMetrics). The behavior (windows, rate limits)
is autoscaler.hpa_behavior, one sync of both autoscaler.hpa.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.1
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
