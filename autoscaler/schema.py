"""The one schema for policy specs: KEDA's ScaledObject and our InferenceAutoscaler.

Written once here as JSON Schema; `validate()` checks YAML against it everywhere (replay, simulator,
controller), and autoscaler.crd derives the Kubernetes CRD in deploy/crds/ from it. Errors name the
file, line and field path, e.g. "x.yaml:9: spec.triggers[0].metadata.threshold: must be a number".

`spec.policy` (the type enum and each type's option block) is derived from the registered policy
types (autoscaler.registry; the built-in ones in autoscaler/policies/), so a type is declared once, in
its own module; spec-level defaults (minReplicas, pollingInterval) are written here.
"""

from __future__ import annotations

import autoscaler.policies  # noqa: F401  (registers the built-in policy types)
from autoscaler.keda_schema import INT0, KEDA_DEFAULTS, KEDA_FIELDS
from autoscaler.registry import block_schema, param_default, registered
from autoscaler.slo import SLO_TARGET
from autoscaler.slo_model import SloModelPolicy
from autoscaler.validation import check, defaults_of, with_defaults
from autoscaler.yamlfile import Document, document

__all__ = ["GROUP", "IA_API_VERSION", "SCALED_OBJECT", "defaults_of", "inference_autoscaler", "policy_schema",
           "validate"]

GROUP = "slopilot.dev"
VERSION = "v1alpha1"
IA_API_VERSION = f"{GROUP}/{VERSION}"
KEDA_API_VERSION = "keda.sh/v1alpha1"

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
            "properties": with_defaults(
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


def policy_schema() -> dict:
    """spec.policy: the type enum and one option block per registered policy type."""
    types = registered()
    return {
        "type": "object",
        "required": ["type"],
        "additionalProperties": False,
        "properties": {"type": {"enum": [pt.name for pt in types]},
                       **{pt.name: block_schema(pt) for pt in types}},
    }


def inference_autoscaler() -> dict:
    """The InferenceAutoscaler schema for the policy types registered now (do not mutate it)."""
    key = tuple(id(pt) for pt in registered())
    if _CACHE.get("key") != key:
        _CACHE.update(key=key, schema=_inference_autoscaler())
    return _CACHE["schema"]


_CACHE: dict = {}


def _inference_autoscaler() -> dict:
    return {
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
                    "policy": policy_schema(),
                },
            },
            "status": {"type": "object"},
        },
    }


def validate(doc: Document | object) -> None:
    """Raise ValueError naming every bad field ("file:line: path: reason; ...") if doc is not a valid spec."""
    doc = document(doc)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a spec must be a mapping with apiVersion, kind, metadata and spec")
    group = str(data.get("apiVersion", "")).split("/")[0]
    schemas = {("keda.sh", "ScaledObject"): SCALED_OBJECT,
               (GROUP, "InferenceAutoscaler"): inference_autoscaler()}
    schema = schemas.get((group, data.get("kind")))
    if schema is None:
        raise doc.error(
            ("apiVersion",),
            f"apiVersion/kind must be {KEDA_API_VERSION} ScaledObject or {IA_API_VERSION} "
            f"InferenceAutoscaler (got {data.get('apiVersion')!r} {data.get('kind')!r})",
        )
    check(schema, doc)
