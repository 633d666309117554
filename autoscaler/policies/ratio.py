"""The ratio policy type: llm-d's SLO-aware ratio law (autoscaler.ratio) on the measured percentiles."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoscaler.ratio import RatioPolicy
from autoscaler.registry import PolicyType, option, param_default, register


def _default(keyword: str) -> object:
    return param_default(RatioPolicy, keyword)


@dataclass(frozen=True)
class RatioOptions:  # field names are RatioPolicy's keywords; its signature holds the defaults
    up: float = option("scaleUpThreshold", _default("up"), {"type": "number", "exclusiveMinimum": 0})
    down: float = option("scaleDownThreshold", _default("down"), {"type": "number", "minimum": 0})
    clamp: float = option("clamp", _default("clamp"), {"type": "number", "exclusiveMinimum": 0})
    window: float = option("windowSeconds", _default("window"), {"type": "number", "minimum": 0})


def build(spec, options: RatioOptions, latency_model) -> RatioPolicy:
    return RatioPolicy(spec.slos, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                       polling_interval=spec.polling_interval, **dataclasses.asdict(options))


RATIO = register(PolicyType(
    "ratio", build, reads=("arrival_rate", "ttft", "tpot", "itl"), options=RatioOptions, needs_slo=True,
    meaning="the llm-d SLO ratio law on the measured TTFT/TPOT percentiles",
))
