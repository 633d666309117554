"""Policy options as specs spell them, and the keyword arguments and defaults they stand for.

A spec's option block (spec.policy.ratio, .sloModel, .kpa) uses camelCase names; make_policy passes
only the options a spec sets, under the class's keyword names, so each default is written once: in
the class's signature. The schema states the same defaults (read from here) for documentation.
"""

from __future__ import annotations

import inspect

from autoscaler.keda import KedaConfig
from autoscaler.kpa import KpaPolicy, KpaSpec


def param_default(fn, name: str) -> object:
    """The default of a keyword of a function, class or dataclass."""
    return inspect.signature(fn).parameters[name].default


# spec option -> the policy's keyword argument (make_policy passes only the options a spec sets)
RATIO_OPTIONS = {
    "scaleUpThreshold": "up",
    "scaleDownThreshold": "down",
    "clamp": "clamp",
    "windowSeconds": "window",
}
SLO_MODEL_OPTIONS = {
    "margin": "margin",
    "forecastWindowSeconds": "forecast_window",
    "scaleDownDelaySeconds": "scale_down_delay",
    "maxBatchSeqs": "max_batch_seqs",
    "promptCV": "prompt_cv",
    "drainSeconds": "drain_seconds",
    "trendWindowSeconds": "trend_window",
    "burstRise": "burst_rise",
    "burstZ": "burst_z",
    "burstSlope": "burst_slope",
    "dropOnFall": "drop_on_fall",
    "arrivalsQuery": "arrivals_query",
    "queueQuery": "queue_query",
    "fastWindowSeconds": "fast_window",
    "seasonPeriodSeconds": "season_period",
    "seasonBins": "season_bins",
    "seasonWeekly": "season_weekly",
    "seasonWeight": "season_weight",
    "batchArrivalsQuery": "batch_arrivals_query",
    "batchQueueQuery": "batch_queue_query",
    "batchDeadlineSeconds": "batch_deadline",
    "burstNoiseFloor": "burst_noise_floor",
}
# Knative's spelling of KpaSpec: percentages of the stable window and of 1.0
_KPA = {name: param_default(KpaSpec, name) for name in inspect.signature(KpaSpec).parameters}
KPA_DEFAULTS = {
    "metric": param_default(KpaPolicy, "metric"),
    "target": 100.0,  # container-concurrency-target-default
    "targetUtilization": 0.7,  # container-concurrency-target-percentage
    "stableWindowSeconds": _KPA["stable_window"],
    "panicWindowPercentage": 100.0 * _KPA["panic_window"] / _KPA["stable_window"],
    "panicThresholdPercentage": 100.0 * _KPA["panic_threshold"],
    "maxScaleUpRate": _KPA["max_scale_up_rate"],
    "maxScaleDownRate": _KPA["max_scale_down_rate"],
    "scaleDownDelaySeconds": _KPA["scale_down_delay"],
}
KEDA_DEFAULTS = {
    "minReplicaCount": param_default(KedaConfig, "min_replica_count"),
    "maxReplicaCount": param_default(KedaConfig, "max_replica_count"),
    "pollingInterval": param_default(KedaConfig, "polling_interval"),
    "cooldownPeriod": param_default(KedaConfig, "cooldown_period"),
    "initialCooldownPeriod": param_default(KedaConfig, "initial_cooldown_period"),
}
