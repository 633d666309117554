"""InferenceAutoscaler -> the equivalent KEDA ScaledObject, where one exists.

The translation is each policy type's own (its registration's to_keda, autoscaler/policies/): keda
copies its block, hpa never deactivates, ratio runs the llm-d law through scalingModifiers; sloModel
and kpa have none (their registrations say why). This module fills what every ScaledObject shares.
"""

from __future__ import annotations

import copy

from autoscaler.spec import Spec


def to_scaled_object(spec: Spec, server_address: str = "http://prometheus:9090") -> tuple[dict, list[str]]:
    """(ScaledObject, notes on where it differs). Raises ValueError when the policy has no equivalent."""
    if spec.kind == "ScaledObject":
        return copy.deepcopy(spec.doc), []
    pt = spec.type
    if pt.to_keda is None:
        why = pt.no_keda or "its registration gives no translation"
        raise ValueError(f"spec.policy.type: {pt.name} has no KEDA equivalent: {why}")
    s = spec.doc["spec"]
    out_spec: dict = {
        "scaleTargetRef": copy.deepcopy(s["scaleTargetRef"]),
        "pollingInterval": max(1, int(round(spec.polling_interval))),
        "minReplicaCount": spec.min_replicas,
        "maxReplicaCount": spec.max_replicas,
    }
    notes = pt.to_keda(spec, out_spec, server_address)
    doc = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": copy.deepcopy(spec.doc["metadata"]),
        "spec": out_spec,
    }
    return doc, notes
