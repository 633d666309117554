"""FLEET.yaml's schema, checked like scenarios and policy specs (autoscaler.validation): every unknown
key and bad value is an error naming file, line and field, e.g.
`fleet.yaml:7: max_replicas: must be >= 1, got 0`. Defaults live in FleetConfig, not here.
"""

from __future__ import annotations

from autoscaler.schema_parts import COUNT0, COUNT1, NONNEG, POS, mapping
from controlplane.loadgen import LOAD

NAME = {"type": "string", "minLength": 1}
FLAG_VALUE = {"type": ["string", "number", "boolean"],
              "x-message": "must be a number, a string or true/false"}

ENGINE = {  # extra `slopilot serve` flags
    "type": "object",
    "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_-]*$"},
    "additionalProperties": FLAG_VALUE,
}
AUTOSCALER = {"type": ["string", "object"],
              "x-message": "must be a spec file path or an inline ScaledObject/InferenceAutoscaler"}
PD_POOL = mapping({"replicas": COUNT0, "min_replicas": COUNT0, "max_replicas": COUNT1, "engine": ENGINE,
                   "autoscaler": AUTOSCALER})
PD = mapping(
    {
        "threshold": COUNT0,  # the router disaggregates prompts with more uncached tokens than this
        "kv_connector": NAME,
        "kv_connector_extra_config": {"type": "object"},  # both roles' (link, lease_timeout_s, ...)
        "prefill": PD_POOL,
        "decode": PD_POOL,
    },
    ("prefill", "decode"),
)

FLEET = mapping(
    {
        "name": NAME,
        "emulate": NAME,  # a shipped latency model or a latency-model JSON
        "model": NAME,  # a preset name or a model directory
        "engine": ENGINE,
        "replicas": COUNT0,
        "min_replicas": COUNT0,
        "max_replicas": COUNT1,
        "drain_timeout": NONNEG,
        "start_timeout": POS,
        "scrape_interval": POS,
        "autoscaler": AUTOSCALER,
        "pd": PD,  # a prefill pool and a decode pool (controlplane.fleet.pd)
        "load": LOAD,
        # the router in front of the fleet: true (its defaults), a ROUTER.yaml path or one inline
        "router": {"type": ["boolean", "string", "object"],
                   "x-message": "must be true, a router config path or an inline EndpointPickerConfig"},
        # the router's batch lines sent with this vLLM `priority` (as `route --batch-engine-priority`)
        "batch_engine_priority": COUNT0,
    },
    **{"x-exactly-one": ["emulate", "model"]},
)
