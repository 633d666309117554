"""The scenario file's schema, checked the way policy specs are (autoscaler.validation): every unknown
key and bad value is an error naming file, line and field, e.g.
`examples/x.yaml:14: pools[0].max_num_seqs: must be >= 1, got 0`.

The schema states no defaults: the Scenario and PoolSpec dataclasses hold them, and the classes that
use a section's values (the router, the schedule policy) hold theirs. Distributions (token lengths,
delays, repair times) are a number or a mapping here; simulator.dists checks their insides.
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.schema_parts import (
    BOOL,
    COUNT0,
    COUNT1,
    FRACTION,
    NONNEG,
    POS,
    STR,
    at_least,
    at_most,
    mapping,
)
from autoscaler.slo import SLO_TARGET
from autoscaler.yamlfile import Document, dotted
from routing.pickers import POLICY_NAMES
from simulator.dists import Dist, parse_dist
from simulator.kvtier import OFFLOAD_SCHEMA
from simulator.latency.loader import LATENCY_MODEL_SCHEMA
from simulator.pd_spec import PD_SCHEMA
from simulator.scenario_limits import (
    MAX_BLOCK_SIZE,
    MAX_CV,
    MAX_DURATION,
    MAX_KV_BLOCKS,
    MAX_NUM_SEQS,
    MAX_RATE,
    MAX_RATE_SCALE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SPIKE_FACTOR,
    MAX_TOKENS,
    MAX_WINDOW,
    MIN_INTERVAL,
    MIN_MTBF,
    MIN_SCRAPE_INTERVAL,
)
from simulator.scenario_router import ROUTER

ROUTERS = POLICY_NAMES  # the registered pickers (routing.pickers), in registration order
SLO_NAMES = ("ttft", "tpot", "itl", "e2e")
TRACE_FORMATS = ("azure", "mooncake", "burstgpt", "csv")

DIST = {"type": ["number", "object"], "x-message": "must be a number or a mapping with a 'dist' key"}


SECONDS = at_most(POS, MAX_DURATION)
AT = at_most(NONNEG, MAX_DURATION)  # a time within the run
RATE = at_most(NONNEG, MAX_RATE)
REPLICAS = at_most(COUNT0, MAX_REPLICAS)
TOKENS = at_most(COUNT1, MAX_TOKENS)


TRACE = mapping(
    {
        "format": {"enum": list(TRACE_FORMATS)},
        "path": STR,
        "rate_scale": at_most(POS, MAX_RATE_SCALE),
        "time_scale": POS,
        "time_unit": POS,
        "start": NONNEG,
        "duration": SECONDS,
        "limit": at_most(COUNT1, MAX_REQUESTS),
        "time_column": STR,
        "prompt_column": STR,
        "output_column": STR,
    },
    ("format", "path"),
)

POINT = {  # a piecewise rate point: [time_s, rate] or {at, rate}
    "if": {"type": "array"},
    "then": {"prefixItems": [AT, RATE], "minItems": 2, "maxItems": 2},
    "else": mapping(
        {"at": AT, "rate": RATE},
        ("at", "rate"),
        **{"x-message": "must be [time_s, rate] or {at, rate}"},
    ),
}

ARRIVALS = mapping(
    {
        "process": {"enum": ["poisson", "gamma"]},
        "cv": at_most(POS, MAX_CV),
        "rate": at_most(POS, MAX_RATE),
        "diurnal": mapping(
            {"mean": at_most(POS, MAX_RATE), "amplitude": {**NONNEG, "maximum": 1}, "period": POS,
             "phase": NONNEG},
            ("mean",),
        ),
        "piecewise": {"type": "array", "minItems": 1, "items": POINT},
        "spikes": {
            "type": "array",
            "items": mapping(
                {"at": AT, "duration": SECONDS, "factor": at_most(NONNEG, MAX_SPIKE_FACTOR),
                 "ramp": at_most(NONNEG, MAX_DURATION)},
                ("at", "duration", "factor"),
            ),
        },
    },
    **{"x-exactly-one": ["rate", "diurnal", "piecewise"]},
)

WORKLOAD = mapping(
    {
        "trace": TRACE,
        "arrivals": ARRIVALS,
        "prompt_tokens": DIST,
        "output_tokens": DIST,
        "lengths_from": TRACE,
        "max_prompt_tokens": TOKENS,
        "max_output_tokens": TOKENS,
    },
    **{"x-exactly-one": ["trace", "arrivals"]},
)

AUTOSCALER = {  # the first of these keys present says which kind of autoscaler it is
    "type": "object",
    "x-message": "must be {fixed: N}, {schedule: [...]}, {spec: file or inline spec} or a whole spec",
    "x-variants": {
        "apiVersion": {"type": "object"},  # a whole spec inline: autoscaler.schema checks it
        "kind": {"type": "object"},
        "fixed": mapping({"fixed": REPLICAS}),
        "schedule": mapping(
            {
                "schedule": {
                    "type": "array",
                    "minItems": 1,
                    "items": mapping({"at": AT, "replicas": REPLICAS}, ("at", "replicas")),
                },
                "polling_interval": at_least(SECONDS, MIN_INTERVAL),
            }
        ),
        "spec": mapping(
            {
                "spec": {"type": ["string", "object"], "x-message": "must be a file path or an inline spec"},
                "latency_model": LATENCY_MODEL_SCHEMA,
            }
        ),
    },
}

POOL = mapping(
    {
        "name": STR,
        "latency_model": LATENCY_MODEL_SCHEMA,  # a fitted model's name or path, or what to derive
        "replicas": REPLICAS,
        "max_num_seqs": at_most(COUNT1, MAX_NUM_SEQS),
        "max_num_batched_tokens": TOKENS,
        "max_model_len": TOKENS,
        "kv_blocks": at_most(COUNT1, MAX_KV_BLOCKS),
        "kv_memory": mapping(
            {
                "gpu_memory_gib": POS,
                "num_gpus": COUNT1,
                "weights_gib": NONNEG,
                "kv_bytes_per_token": POS,
                "utilization": FRACTION,
            },
            ("gpu_memory_gib", "weights_gib", "kv_bytes_per_token"),
        ),
        "block_size": at_most(COUNT1, MAX_BLOCK_SIZE),
        "kv_offload": OFFLOAD_SCHEMA,  # a host-memory tier behind the KV cache (simulator.kvtier)
        "prefix_caching": BOOL,
        "chunked_prefill": BOOL,  # off: each prompt computed whole in one step
        "provisioning_delay": DIST,  # from a scale-up to the new replica serving
        "startup_delay": DIST,  # the older name of provisioning_delay
        "cost_per_hour": NONNEG,
        "step_overhead_ms": NONNEG,
        "wakeup_ms": NONNEG,
        "settings_from_model": BOOL,  # scheduling settings not given here: the latency model's recorded ones
        "frontend_from_model": BOOL,  # each request first waits a delay drawn from the measured front end
        "failure": mapping(
            {"mtbf": at_least(POS, MIN_MTBF), "repair": DIST, "on_failure": {"enum": ["retry", "drop"]}},
            ("mtbf",),
        ),
        "autoscaler": AUTOSCALER,
        # the labels its engines' series carry, as a Kubernetes scrape of vLLM shows them: what a
        # trigger's query filters on (pod: a pattern with {pool} and {replica})
        "labels": mapping({"model_name": STR, "namespace": STR, "pod": STR, "engine": STR}),
    },
    ("name", "latency_model"),
    allOf=[
        {"x-at-most-one": ["kv_blocks", "kv_memory"]},
        {"x-at-most-one": ["provisioning_delay", "startup_delay"]},
    ],
)

# a report may ask for the maximum (p100), which no policy could steer to
SLO = {
    "if": {"type": "number"},
    "then": POS,  # seconds at the default percentile
    "else": {
        **SLO_TARGET,
        "properties": {**SLO_TARGET["properties"], "percentile": {**POS, "maximum": 100}},
        "x-message": "must be seconds or a mapping {percentile, seconds}",
    },
}

SCENARIO = mapping(
    {
        "name": STR,
        "seed": COUNT0,
        "duration": SECONDS,
        # SLO statistics count the requests arriving at or after this time (a queue's warm-up from empty
        # is optimistic at a high load; the planner's steady-state runs discard their first third)
        "warmup": NONNEG,
        "workload": WORKLOAD,
        "pools": {"type": "array", "minItems": 1, "items": POOL},
        "router": ROUTER,
        "autoscaler": AUTOSCALER,  # for every pool that has none of its own
        "pd": PD_SCHEMA,  # a prefill pool and a decode pool joined by a KV link (simulator.pd_spec)
        "slo": mapping({name: SLO for name in SLO_NAMES}),
        "metrics": mapping(
            {
                "scrape_interval": at_least(SECONDS, MIN_SCRAPE_INTERVAL),
                "rate_window": at_most(POS, MAX_WINDOW),
                # Prometheus recording rules (promql.rules): rule files (or PrometheusRule
                # manifests) next to the scenario, and/or one rule file's content inline
                "rule_files": {"type": "array", "items": STR},
                "rules": {"type": "object",
                          "x-message": "must be a rule file's content: a mapping with groups"},
                # a rule group's default interval and a subquery's default step, as Prometheus' global one
                "evaluation_interval": at_least(SECONDS, MIN_SCRAPE_INTERVAL),
            }
        ),
        "output": mapping({"timeline_interval": at_least(SECONDS, MIN_INTERVAL)}),
        "drain": mapping({"enabled": BOOL, "max": at_most(NONNEG, MAX_DURATION)}),
        "currency": {"type": "string", "minLength": 1, "maxLength": 16},  # of the pools' cost_per_hour
    },
    ("workload", "pools"),
)


# ---- reading validated fields ----------------------------------------------------------------------


def resolve(path: str, base: Path) -> str:
    """A path from the file, relative to the scenario's folder."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def dist_at(doc: Document, key: str, integer: bool = False) -> Dist:
    """The distribution at doc[key], its errors naming file, line and field."""
    field = dotted(doc.prefix + (key,))
    try:
        return parse_dist(doc.data[key], field, integer=integer)
    except ValueError as exc:
        text = str(exc) if str(exc).startswith(field) else f"{field}: {exc}"
        raise ValueError(": ".join(p for p in (doc.location((key,)), text) if p)) from None
