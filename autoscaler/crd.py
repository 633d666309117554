"""The InferenceAutoscaler CRD, derived from the spec schema in autoscaler.schema (with every registered
policy type).

    python -m autoscaler.crd > deploy/crds/inferenceautoscaler.yaml

Kubernetes wants a structural OpenAPI v3 schema: every node typed, no `additionalProperties: false`
beside `properties` (unknown fields are pruned instead), no `const`; our extension keywords become
their Kubernetes spellings.
"""

from __future__ import annotations

import copy

import yaml

from autoscaler.schema import GROUP, VERSION, inference_autoscaler

OPEN_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def structural(node: object) -> object:
    """Translate our JSON Schema into a Kubernetes structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "x-number":  # trigger metadata and tolerances are strings in Kubernetes objects
            out["x-kubernetes-int-or-string"] = True
        elif key == "x-exactly-one":
            out["oneOf"] = [{"required": [k]} for k in value]
        elif key.startswith("x-") and not key.startswith("x-kubernetes-"):
            continue  # our messages and the like
        elif key == "const":
            out["type"], out["enum"] = "string", [value]
        elif key == "additionalProperties" and value is False:
            continue
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # OpenAPI v3.0 (what the API server reads) spells an exclusive bound as a flag on min/max
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = structural(value)
    if "anyOf" in out:  # a boolean or its string spelling
        out.pop("anyOf")
        out["x-kubernetes-int-or-string"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def crd() -> dict:
    schema = copy.deepcopy(inference_autoscaler())
    schema["properties"]["metadata"] = {"type": "object"}  # the API server owns metadata's schema
    schema["properties"]["status"] = copy.deepcopy(OPEN_OBJECT)
    policies = schema["properties"]["spec"]["properties"]["policy"]["properties"]
    for block in policies.values():  # trigger metadata is an open map in KEDA too
        triggers = block.get("properties", {}).get("triggers", {}).get("items", {}).get("properties")
        if triggers is not None:
            triggers["metadata"] = copy.deepcopy(OPEN_OBJECT)
            triggers["authenticationRef"] = copy.deepcopy(OPEN_OBJECT)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"inferenceautoscalers.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "InferenceAutoscaler",
                "listKind": "InferenceAutoscalerList",
                "plural": "inferenceautoscalers",
                "singular": "inferenceautoscaler",
                "shortNames": ["ias"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Target", "type": "string", "jsonPath": ".spec.scaleTargetRef.name"},
                        {"name": "Policy", "type": "string", "jsonPath": ".spec.policy.type"},
                        {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
                        {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
                    ],
                    "schema": {"openAPIV3Schema": structural(schema)},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated from autoscaler/schema.py by `python -m autoscaler.crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=110)


if __name__ == "__main__":
    print(crd_yaml(), end="")
