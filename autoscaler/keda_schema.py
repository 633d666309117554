"""KEDA's ScaledObject fields as JSON Schema: triggers, behavior, fallback, advanced (scalingModifiers).

Shared by the ScaledObject schema (autoscaler.schema) and the keda and hpa policy blocks
(autoscaler/policies/keda.py). The defaults stated are KedaConfig's, so they are written once, there.
"""

from __future__ import annotations

from autoscaler.keda import KedaConfig
from autoscaler.registry import param_default
from autoscaler.validation import with_defaults

NUM = {"x-number": True}
INT0 = {"type": "integer", "minimum": 0}
BOOLISH = {
    "anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false", "True", "False"]}],
    "x-message": "must be true or false",
}


KEDA_DEFAULTS = {
    "minReplicaCount": param_default(KedaConfig, "min_replica_count"),
    "maxReplicaCount": param_default(KedaConfig, "max_replica_count"),
    "pollingInterval": param_default(KedaConfig, "polling_interval"),
    "cooldownPeriod": param_default(KedaConfig, "cooldown_period"),
    "initialCooldownPeriod": param_default(KedaConfig, "initial_cooldown_period"),
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
KEDA_FIELDS = with_defaults(
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
