"""The EndpointPickerConfig's schema (routing.config reads the file), its plugin types those of the
registered scorers and pickers, and its durations (100ms, 5s, 2m, 1h or plain seconds)."""

from __future__ import annotations

import re

from autoscaler.schema_parts import mapping
from autoscaler.yamlfile import Document
from routing.pickers import PICKERS
from routing.scorers import SCORER_PLUGINS


def scorer_types() -> dict[str, str]:
    """EndpointPickerConfig scorer plugin type -> the registered scorer it runs (routing.scorers)."""
    return {p.plugin_type: p.name for p in SCORER_PLUGINS.values() if p.plugin_type}


def picker_types() -> dict[str, str]:
    """EndpointPickerConfig picker plugin type -> the registered picker (routing.pickers)."""
    return {p.plugin_type: p.name for p in PICKERS.values() if p.plugin_type}


API_VERSIONS = ("llm-d.ai/v1", "llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
DURATION = {"type": ["number", "string"], "x-message": "must be seconds or a duration such as 100ms, 5s, 2m"}
PARAMS = {"type": "object"}
NUM = {"type": "number", "minimum": 0}


def router_schema() -> dict:
    """The EndpointPickerConfig schema, its plugin types those of the registered scorers and pickers."""
    return mapping(_properties([*scorer_types(), *picker_types()]), ("kind",))


def _properties(plugin_types: list[str]) -> dict:
    return {
        "apiVersion": {"enum": list(API_VERSIONS)},
        "kind": {"const": "EndpointPickerConfig"},
        "featureGates": {"type": "array", "items": {"type": "string"}},
        "plugins": {"type": "array", "items": mapping(
            {"name": {"type": "string"}, "type": {"enum": plugin_types},
             "parameters": PARAMS}, ("type",))},
        "schedulingProfiles": {"type": "array", "maxItems": 1, "items": mapping(
            {"name": {"type": "string"}, "plugins": {"type": "array", "items": mapping(
                {"pluginRef": {"type": "string"}, "weight": NUM}, ("pluginRef",))}}, ("name",))},
        "saturationDetector": mapping({"queueDepthThreshold": {"type": "integer", "minimum": 1},
                                       "kvCacheUtilThreshold": {"type": "number", "exclusiveMinimum": 0,
                                                                "maximum": 1}}),
        "flowControl": mapping({
            "defaultPriority": {"type": "integer"},
            "defaultRequestTTL": DURATION,
            "priorityBands": {"type": "array", "minItems": 1, "items": mapping(
                {"priority": {"type": "integer"}, "name": {"type": "string"},
                 "maxRequests": {"type": "integer", "minimum": 0}, "ttl": DURATION,
                 "saturation": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}, ("priority",))},
            "objectives": {"type": "object", "additionalProperties": {"type": "integer"}},
        }),
        "timeouts": mapping({"firstByte": DURATION, "total": DURATION, "routes": {
            "type": "object", "additionalProperties": mapping({"firstByte": DURATION, "total": DURATION})}}),
        "dataLayer": mapping({"refreshInterval": DURATION, "healthCheckInterval": DURATION,
                              "scrapeTimeout": DURATION, "ejectAfter": {"type": "integer", "minimum": 1},
                              "connectTimeout": DURATION, "maxRetries": {"type": "integer", "minimum": 0}}),
    }

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")


def seconds(value: float | str) -> float:
    """100ms, 5s, 2m, 1h or a plain number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _DURATION_RE.match(value)
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]




def duration(doc: Document, path: tuple, value) -> float:
    """seconds(value), its error at the field's file and line."""
    try:
        s = seconds(value)
    except ValueError as exc:
        raise doc.error(path, str(exc)) from None
    if s <= 0:
        raise doc.error(path, f"must be > 0, got {value!r}")
    return s


def keys() -> list[str]:
    """The EndpointPickerConfig's top-level fields (a scenario's router block holding one of them is
    an EndpointPickerConfig, not the shorthand)."""
    return list(_properties([]))
