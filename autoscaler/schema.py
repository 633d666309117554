"""The one schema for policy specs: KEDA's ScaledObject and our InferenceAutoscaler.

Written once here as JSON Schema; `validate()` checks YAML against it everywhere (replay, simulator,
controller), and `crd()` derives the Kubernetes CRD in deploy/crds/ from it. Errors name the field path
and the reason, e.g. "spec.triggers[0].metadata.threshold: must be a number".

One extension keyword: "x-number" accepts a number or a string holding one, because KEDA trigger
metadata is map[string]string ("threshold: '5'") while people also write plain numbers.
"""

from __future__ import annotations

import copy
import re

import jsonschema

GROUP = "slopilot.dev"
VERSION = "v1alpha1"
IA_API_VERSION = f"{GROUP}/{VERSION}"
KEDA_API_VERSION = "keda.sh/v1alpha1"
NUMBER_RE = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")

NUM = {"x-number": True}
INT0 = {"type": "integer", "minimum": 0}
BOOLISH = {
    "anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false", "True", "False"]}],
    "x-message": "must be true or false",
}

SCALE_TARGET_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"type": "string"},
        "apiVersion": {"type": "string"},
        "envSourceContainerName": {"type": "string"},
    },
}

SCALING_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "tolerance": NUM,
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
    },
}

BEHAVIOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"scaleUp": SCALING_RULES, "scaleDown": SCALING_RULES},
}

PROMETHEUS_METADATA = {
    "type": "object",
    "required": ["query", "threshold"],
    "properties": {
        "serverAddress": {"type": "string"},
        "query": {"type": "string", "minLength": 1},
        "threshold": NUM,
        "activationThreshold": NUM,
        "ignoreNullValues": BOOLISH,
        "unsafeSsl": BOOLISH,
        "timeout": NUM,
        "namespace": {"type": "string"},
        "customHeaders": {"type": "string"},
        "queryParameters": {"type": "string"},
        "authModes": {"type": "string"},
    },
    "additionalProperties": {"type": "string"},  # KEDA metadata is map[string]string
}

TRIGGER = {
    "type": "object",
    "required": ["type", "metadata"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": ["prometheus"], "x-message": "only prometheus triggers are supported"},
        "name": {
            "type": "string",
            "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
            "x-message": "must be a name usable in a formula (letters, digits, _)",
        },
        "metricType": {"enum": ["Value", "AverageValue"]},
        "metadata": PROMETHEUS_METADATA,
        "authenticationRef": {"type": "object"},
        "useCachedMetrics": {"type": "boolean"},
    },
}

TRIGGERS = {"type": "array", "minItems": 1, "items": TRIGGER}

FALLBACK = {
    "type": "object",
    "required": ["failureThreshold", "replicas"],
    "additionalProperties": False,
    "properties": {
        "failureThreshold": INT0,
        "replicas": INT0,
        "behavior": {
            "enum": ["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"]
        },
    },
}

ADVANCED = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "restoreToOriginalReplicaCount": {"type": "boolean"},
        "horizontalPodAutoscalerConfig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "behavior": BEHAVIOR},
        },
        "scalingModifiers": {
            "type": "object",
            "required": ["formula", "target"],
            "additionalProperties": False,
            "properties": {
                "formula": {"type": "string", "minLength": 1},
                "target": NUM,
                "activationTarget": NUM,
                "metricType": {"enum": ["Value", "AverageValue"]},
            },
        },
    },
}

# the KEDA-specific part, shared by the ScaledObject spec and our policy.keda block
KEDA_FIELDS = {
    "cooldownPeriod": INT0,
    "initialCooldownPeriod": INT0,
    "idleReplicaCount": INT0,
    "fallback": FALLBACK,
    "advanced": ADVANCED,
    "triggers": TRIGGERS,
}

SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": KEDA_API_VERSION},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": SCALE_TARGET_REF,
                "pollingInterval": {"type": "integer", "minimum": 1},
                "minReplicaCount": INT0,
                "maxReplicaCount": INT0,
                **KEDA_FIELDS,
            },
        },
        "status": {"type": "object"},
    },
}

SLO_TARGET = {
    "type": "object",
    "required": ["seconds"],
    "additionalProperties": False,
    "properties": {
        "percentile": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
        "seconds": {"type": "number", "exclusiveMinimum": 0},
    },
}

POLICY = {
    "type": "object",
    "required": ["type"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": ["keda", "hpa", "ratio", "sloModel", "kpa"]},
        "keda": {
            "type": "object",
            "required": ["triggers"],
            "additionalProperties": False,
            "properties": KEDA_FIELDS,
        },
        "hpa": {
            "type": "object",
            "required": ["triggers"],
            "additionalProperties": False,
            "properties": {"triggers": TRIGGERS, "behavior": BEHAVIOR, "tolerance": NUM},
        },
        "ratio": {  # the llm-d SLO-aware ratio law
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "scaleUpThreshold": {"type": "number", "exclusiveMinimum": 0},
                "scaleDownThreshold": {"type": "number", "minimum": 0},
                "clamp": {"type": "number", "exclusiveMinimum": 0},
                "windowSeconds": {"type": "number", "minimum": 0},
            },
        },
        "sloModel": {  # model-based SLO headroom
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "margin": {"type": "number", "minimum": 0, "maximum": 0.9},
                "forecastWindowSeconds": {"type": "number", "exclusiveMinimum": 0},
                "scaleDownDelaySeconds": {"type": "number", "minimum": 0},
                "maxBatchSeqs": {"type": "integer", "minimum": 1},
                "promptCV": {"type": "number", "minimum": 0},
                "drainSeconds": {"type": "number", "exclusiveMinimum": 0},
                # the short burst trend: its window, the rise it must predict, the noise gate
                "trendWindowSeconds": {"type": "number", "exclusiveMinimum": 0},
                "burstRise": {"type": "number", "minimum": 0},
                "burstZ": {"type": "number", "minimum": 0},
                "burstSlope": {"enum": ["trend", "last"]},
                "dropOnFall": {"type": "boolean"},
            },
        },
        "kpa": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "metric": {"enum": ["concurrency", "rps"]},
                "target": {"type": "number", "exclusiveMinimum": 0},
                "targetUtilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "stableWindowSeconds": {"type": "number", "minimum": 6, "maximum": 3600},
                "panicWindowPercentage": {"type": "number", "minimum": 1, "maximum": 100},
                "panicThresholdPercentage": {"type": "number", "minimum": 110},
                "maxScaleUpRate": {"type": "number", "exclusiveMinimum": 1},
                "maxScaleDownRate": {"type": "number", "exclusiveMinimum": 1},
                "scaleDownDelaySeconds": {"type": "number", "minimum": 0},
            },
        },
    },
}

INFERENCE_AUTOSCALER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": IA_API_VERSION},
        "kind": {"const": "InferenceAutoscaler"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "maxReplicas", "policy"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": SCALE_TARGET_REF,
                "minReplicas": INT0,
                "maxReplicas": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "number", "exclusiveMinimum": 0},
                "startupDelaySeconds": {"type": "number", "minimum": 0},
                "slo": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"ttft": SLO_TARGET, "tpot": SLO_TARGET},
                },
                "policy": POLICY,
            },
        },
        "status": {"type": "object"},
    },
}

SCHEMAS = {("keda.sh", "ScaledObject"): SCALED_OBJECT, (GROUP, "InferenceAutoscaler"): INFERENCE_AUTOSCALER}


# ---- validation with field-path messages ----------------------------------------------------------


def _x_number(validator, value, instance, schema):
    if not value:
        return
    ok = (isinstance(instance, (int, float)) and not isinstance(instance, bool)) or (
        isinstance(instance, str) and NUMBER_RE.match(instance)
    )
    if not ok:
        yield jsonschema.ValidationError("must be a number")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"x-number": _x_number})
_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _message(err: jsonschema.ValidationError) -> tuple[str, str]:
    path = _path(err.absolute_path)
    custom = err.schema.get("x-message") if isinstance(err.schema, dict) else None
    kind, arg = err.validator, err.validator_value
    if kind == "required":
        missing = next((r for r in arg if r not in err.instance), arg[0])
        return _path(list(err.absolute_path) + [missing]), "is required"
    if custom and kind in ("enum", "pattern", "anyOf", "const"):
        return path, custom
    if kind == "type":
        names = arg if isinstance(arg, list) else [arg]
        return path, "must be " + " or ".join(_TYPE_NAMES.get(n, n) for n in names)
    if kind in ("enum", "const"):
        options = arg if kind == "enum" else [arg]
        return path, "must be one of " + ", ".join(str(o) for o in options)
    if kind == "additionalProperties":
        extra = sorted(k for k in err.instance if k not in err.schema.get("properties", {}))
        return path, "unknown field " + ", ".join(repr(k) for k in extra)
    reasons = {
        "minimum": f"must be >= {arg}",
        "maximum": f"must be <= {arg}",
        "exclusiveMinimum": f"must be > {arg}",
        "exclusiveMaximum": f"must be < {arg}",
        "minItems": f"must have at least {arg} item(s)",
        "minLength": "must not be empty",
        "pattern": f"must match {arg}",
    }
    return path, reasons.get(kind, err.message)


def validate(doc: object) -> None:
    """Raise ValueError naming every bad field ("path: reason; path: reason") if doc is not a valid spec."""
    if not isinstance(doc, dict):
        raise ValueError("spec: must be a mapping with apiVersion, kind, metadata and spec")
    group = str(doc.get("apiVersion", "")).split("/")[0]
    schema = SCHEMAS.get((group, doc.get("kind")))
    if schema is None:
        raise ValueError(
            f"apiVersion/kind: must be {KEDA_API_VERSION} ScaledObject or "
            f"{IA_API_VERSION} InferenceAutoscaler (got {doc.get('apiVersion')!r} {doc.get('kind')!r})"
        )
    errors = sorted(
        _Validator(schema).iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    )
    if errors:
        msgs = []
        for e in errors:
            path, reason = _message(e)
            line = f"{path or '(root)'}: {reason}"
            if line not in msgs:
                msgs.append(line)
        raise ValueError("; ".join(msgs))


# ---- the CRD derived from the same schema ------------------------------------------------------


def _structural(node: object) -> object:
    """Translate our JSON Schema into a Kubernetes structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [_structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("x-message",):
            continue
        if key == "x-number":  # trigger metadata and tolerances are strings in Kubernetes objects
            out["x-kubernetes-int-or-string"] = True
            continue
        if key == "const":
            out["type"], out["enum"] = "string", [value]
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields; `false` is not allowed beside properties
        out[key] = _structural(value)
    if "anyOf" in out:  # BOOLISH: accept a boolean or its string spelling
        out.pop("anyOf")
        out["x-kubernetes-int-or-string"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def crd() -> dict:
    schema = copy.deepcopy(INFERENCE_AUTOSCALER)
    schema["properties"]["metadata"] = {"type": "object"}  # the API server owns metadata's schema
    schema["properties"]["status"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    spec = schema["properties"]["spec"]
    # trigger metadata is an open map in KEDA too
    trig = spec["properties"]["policy"]["properties"]
    for name in ("keda", "hpa"):
        trig[name]["properties"]["triggers"]["items"]["properties"]["metadata"] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        trig[name]["properties"]["triggers"]["items"]["properties"]["authenticationRef"] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
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
                    "schema": {"openAPIV3Schema": _structural(schema)},
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml

    header = "# Generated from autoscaler/schema.py by `python -m autoscaler.schema`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=110)


if __name__ == "__main__":
    print(crd_yaml(), end="")
