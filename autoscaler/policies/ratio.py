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


TPOT_METRIC = "vllm:inter_token_latency_seconds_bucket"
TTFT_METRIC = "vllm:time_to_first_token_seconds_bucket"


def _num(v: float) -> str:
    return f"{v:g}"


def _quantile_query(metric: str, q: float, window: float, target: str) -> str:
    return (
        f'histogram_quantile({_num(q / 100)}, sum(rate({metric}{{model_name="{target}"}}'
        f"[{int(round(window))}s])) by (le))"
    )


def to_keda(spec, out_spec: dict, server_address: str) -> list[str]:
    """The llm-d law through scalingModifiers: a Prometheus trigger per SLO (its percentile over the
    smoothing window), formula min(max(ttft / T_ttft, tpot / T_tpot), clamp), target = the scale-up
    threshold with metricType Value, so the HPA computes ceil(s / up x ready) -- the law's scale-up
    step with in-flight credit -- and a scale-down tolerance of 1 - down / up makes the dead band."""
    o: RatioOptions = spec.config
    up, down, clamp, window = o.up, o.down, o.clamp, o.window
    triggers, terms = [], []
    for slo in spec.slos:
        metric = TTFT_METRIC if slo.metric == "ttft" else TPOT_METRIC
        triggers.append(
            {
                "type": "prometheus",
                "name": slo.metric,
                "metricType": "Value",
                "metadata": {
                    "serverAddress": server_address,
                    "query": _quantile_query(metric, slo.percentile, window, spec.target),
                    "threshold": _num(slo.seconds),
                    "ignoreNullValues": "true",
                },
            }
        )
        terms.append(f"{slo.metric} / {_num(slo.seconds)}")
    ratio = terms[0] if len(terms) == 1 else f"max({', '.join(terms)})"
    out_spec["triggers"] = triggers
    out_spec["advanced"] = {
        "scalingModifiers": {
            "formula": f"min({ratio}, {_num(clamp)})",
            "target": _num(up),
            "activationTarget": "0",
            "metricType": "Value",
        },
        "horizontalPodAutoscalerConfig": {
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "tolerance": "0",
                    "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 15}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 0,
                    "tolerance": _num(round(1 - down / up, 4)),
                },
            }
        },
    }
    return [
        f"smoothing: the {int(window)} s mean of s becomes {int(window)} s rate windows in the queries",
        f"scale-down step: the HPA goes to ceil(s / {_num(up)} x ready), the ratio law to "
        f"n - floor(n x (1 - s / {_num(down)})) (the HPA shrinks faster)",
        "scale-up rate: the HPA allows at most 11x the replicas per 15 s (Percent 1000), the law none",
        "per-direction tolerance needs Kubernetes >= 1.33 with the HPAConfigurableTolerance feature gate",
    ]


def build(spec, options: RatioOptions, latency_model) -> RatioPolicy:
    return RatioPolicy(spec.slos, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                       polling_interval=spec.polling_interval, **dataclasses.asdict(options))


RATIO = register(PolicyType(
    "ratio", build, reads=("arrival_rate", "ttft", "tpot", "itl"), options=RatioOptions, needs_slo=True,
    meaning="the llm-d SLO ratio law on the measured TTFT/TPOT percentiles", to_keda=to_keda,
))
