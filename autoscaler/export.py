"""InferenceAutoscaler -> the equivalent KEDA ScaledObject, where one exists.

keda: the same triggers and options, verbatim. hpa: a ScaledObject that never deactivates
(minReplicaCount >= 1) with the HPA behavior. ratio: the llm-d law through scalingModifiers -- two
Prometheus triggers (TTFT and TPOT percentiles over the smoothing window), formula
min(max(ttft / T_ttft, tpot / T_tpot), clamp), target = the scale-up threshold with metricType Value,
so the HPA computes ceil(s / up x ready) -- exactly the law's scale-up step with in-flight credit -- and
a scale-down tolerance of 1 - down / up makes the dead band. sloModel and kpa have no KEDA equivalent.
"""

from __future__ import annotations

import copy

from autoscaler.schema import defaults_of, policy_schema
from autoscaler.spec import Spec

NO_EQUIVALENT = {
    "sloModel": "the model-based SLO-headroom policy predicts latency from a step-time model and forecasts "
    "the arrival rate; KEDA triggers cannot express it",
    "kpa": "Knative's stable/panic windows and rate limits have no KEDA/HPA counterpart",
}

TPOT_METRIC = "vllm:inter_token_latency_seconds_bucket"
TTFT_METRIC = "vllm:time_to_first_token_seconds_bucket"


def _num(v: float) -> str:
    return f"{v:g}"


def _quantile_query(metric: str, q: float, window: float, target: str) -> str:
    return (
        f'histogram_quantile({_num(q / 100)}, sum(rate({metric}{{model_name="{target}"}}'
        f"[{int(round(window))}s])) by (le))"
    )


def to_scaled_object(spec: Spec, server_address: str = "http://prometheus:9090") -> tuple[dict, list[str]]:
    """(ScaledObject, notes on where it differs). Raises ValueError when the policy has no equivalent."""
    if spec.kind == "ScaledObject":
        return copy.deepcopy(spec.doc), []
    if spec.policy_type in NO_EQUIVALENT:
        raise ValueError(
            f"spec.policy.type: {spec.policy_type} has no KEDA equivalent: {NO_EQUIVALENT[spec.policy_type]}"
        )
    s = spec.doc["spec"]
    out_spec: dict = {
        "scaleTargetRef": copy.deepcopy(s["scaleTargetRef"]),
        "pollingInterval": max(1, int(round(spec.polling_interval))),
        "minReplicaCount": spec.min_replicas,
        "maxReplicaCount": spec.max_replicas,
    }
    notes: list[str] = []
    block = copy.deepcopy(spec.options)
    if spec.policy_type == "keda":
        out_spec.update(block)
    elif spec.policy_type == "hpa":
        if spec.min_replicas < 1:
            notes.append("minReplicaCount raised to 1: the hpa policy never scales to zero")
            out_spec["minReplicaCount"] = 1
        out_spec["triggers"] = block["triggers"]
        behavior = block.get("behavior")
        if "tolerance" in block:
            behavior = copy.deepcopy(behavior or {})
            for side in ("scaleUp", "scaleDown"):
                behavior.setdefault(side, {}).setdefault("tolerance", str(block["tolerance"]))
            notes.append(
                "tolerance moved to behavior.scaleUp/scaleDown.tolerance (Kubernetes >= 1.33, "
                "feature gate HPAConfigurableTolerance)"
            )
        if behavior:
            out_spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
    elif spec.policy_type == "ratio":
        o = {**defaults_of(policy_schema()["properties"]["ratio"]), **block}
        up, down = o["scaleUpThreshold"], o["scaleDownThreshold"]
        clamp, window = o["clamp"], o["windowSeconds"]
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
        notes += [
            f"smoothing: the {int(window)} s mean of s becomes {int(window)} s rate windows in the queries",
            f"scale-down step: the HPA goes to ceil(s / {_num(up)} x ready), the ratio law to "
            f"n - floor(n x (1 - s / {_num(down)})) (the HPA shrinks faster)",
            "scale-up rate: the HPA allows at most 11x the replicas per 15 s (Percent 1000), the law none",
            "per-direction tolerance needs Kubernetes >= 1.33 with the HPAConfigurableTolerance feature gate",
        ]
    doc = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": copy.deepcopy(spec.doc["metadata"]),
        "spec": out_spec,
    }
    return doc, notes
