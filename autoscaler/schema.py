"""The one schema for policy specs: KEDA's ScaledObject and our InferenceAutoscaler.

Written once here as JSON Schema; `validate()` checks YAML against it everywhere (replay, simulator,
controller), and autoscaler.crd derives the Kubernetes CRD in deploy/crds/ from it. Errors name the
file, line and field path, e.g. "x.yaml:9: spec.triggers[0].metadata.threshold: must be a number".

The defaults the schema states are read from the classes that apply them (autoscaler.options), so
they are written once, there; spec-level ones (minReplicas, pollingInterval) are written here.
"""

from __future__ import annotations

from autoscaler.options import (
    KEDA_DEFAULTS,
    KPA_DEFAULTS,
    RATIO_OPTIONS,
    SLO_MODEL_OPTIONS,
    param_default,
)
from autoscaler.ratio import RatioPolicy
from autoscaler.slo import SLO_TARGET
from autoscaler.slo_model import SloModelPolicy
from autoscaler.validation import check
from autoscaler.yamlfile import Document, document

GROUP = "slopilot.dev"
VERSION = "v1alpha1"
IA_API_VERSION = f"{GROUP}/{VERSION}"
KEDA_API_VERSION = "keda.sh/v1alpha1"

NUM = {"x-number": True}
INT0 = {"type": "integer", "minimum": 0}
BOOLISH = {
    "anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false", "True", "False"]}],
    "x-message": "must be true or false",
}


def _defaults(properties: dict, defaults: dict) -> dict:
    """properties with each default stated (JSON Schema's `default` annotation; it validates nothing)."""
    out = dict(properties)
    for k, value in defaults.items():
        if k in out:  # an integer field states an integer default (the CRD's schema requires it)
            out[k] = {**out[k], "default": int(value) if out[k].get("type") == "integer" else value}
    return out


def defaults_of(schema: dict) -> dict:
    """The default of each field of an object schema that states one, by field name."""
    return {k: v["default"] for k, v in schema.get("properties", {}).items() if "default" in v}


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
KEDA_FIELDS = _defaults(
    {
        "cooldownPeriod": INT0,
        "initialCooldownPeriod": INT0,
        "idleReplicaCount": INT0,
        "fallback": FALLBACK,
        "advanced": ADVANCED,
        "triggers": TRIGGERS,
    },
    KEDA_DEFAULTS,
)

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
            "properties": _defaults(
                {
                    "scaleTargetRef": SCALE_TARGET_REF,
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "minReplicaCount": INT0,
                    "maxReplicaCount": INT0,
                    **KEDA_FIELDS,
                },
                KEDA_DEFAULTS,
            ),
        },
        "status": {"type": "object"},
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
            "properties": _defaults(
                {
                    "scaleUpThreshold": {"type": "number", "exclusiveMinimum": 0},
                    "scaleDownThreshold": {"type": "number", "minimum": 0},
                    "clamp": {"type": "number", "exclusiveMinimum": 0},
                    "windowSeconds": {"type": "number", "minimum": 0},
                },
                {k: param_default(RatioPolicy, kw) for k, kw in RATIO_OPTIONS.items()},
            ),
        },
        "sloModel": {  # model-based SLO headroom
            "type": "object",
            "additionalProperties": False,
            "properties": _defaults(
                {
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
                    "burstSlope": {"enum": ["trend", "last", "onset"]},
                    "dropOnFall": {"type": "boolean"},
                    # fast router signals: PromQL for the arrival counter and the gateway queue
                    "arrivalsQuery": {"type": "string"},
                    "queueQuery": {"type": "string"},
                    "fastWindowSeconds": {"type": "number", "exclusiveMinimum": 0},
                    # a learned time-of-day profile (period 0: none)
                    "seasonPeriodSeconds": {"type": "number", "minimum": 0},
                    "seasonBins": {"type": "integer", "minimum": 1, "maximum": 10000},
                    "seasonWeekly": {"type": "boolean"},
                    "seasonWeight": {"type": "number", "minimum": 0, "maximum": 1},
                    # a deferrable batch band: its arrival counter, gateway queue and deadline
                    "batchArrivalsQuery": {"type": "string"},
                    "batchQueueQuery": {"type": "string"},
                    "batchDeadlineSeconds": {"type": "number", "exclusiveMinimum": 0},
                    # the burst test's spread at least a fast-window rate's counting noise
                    "burstNoiseFloor": {"type": "boolean"},
                },
                {k: param_default(SloModelPolicy, kw) for k, kw in SLO_MODEL_OPTIONS.items()},
            ),
        },
        "kpa": {
            "type": "object",
            "additionalProperties": False,
            "properties": _defaults(
                {
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
                KPA_DEFAULTS,
            ),
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
                "minReplicas": {**INT0, "default": 1},
                "maxReplicas": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "number", "exclusiveMinimum": 0, "default": 15},
                # what the policy assumes a new replica takes to serve (the sloModel looks that far ahead)
                "startupDelaySeconds": {
                    "type": "number",
                    "minimum": 0,
                    "default": param_default(SloModelPolicy, "startup_delay"),
                },
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


def validate(doc: Document | object) -> None:
    """Raise ValueError naming every bad field ("file:line: path: reason; ...") if doc is not a valid spec."""
    doc = document(doc)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a spec must be a mapping with apiVersion, kind, metadata and spec")
    group = str(data.get("apiVersion", "")).split("/")[0]
    schema = SCHEMAS.get((group, data.get("kind")))
    if schema is None:
        raise doc.error(
            ("apiVersion",),
            f"apiVersion/kind must be {KEDA_API_VERSION} ScaledObject or {IA_API_VERSION} "
            f"InferenceAutoscaler (got {data.get('apiVersion')!r} {data.get('kind')!r})",
        )
    check(schema, doc)
