"""The plan file's schema, checked like a scenario's (autoscaler.validation): every unknown key and bad
value is an error naming file, line and field, e.g. `plan.yaml:12: deployments[0].price_per_gpu_hour:
must be > 0, got -1`.

A plan reuses the scenario's sections where they mean the same thing (workload, slo, router, a pool's
engine fields). Defaults live in simulator.planner.plan, next to the code that reads them.
"""

from __future__ import annotations

from autoscaler.schema_parts import COUNT0, COUNT1, POS, STR, at_most, mapping
from simulator.pd_spec import PD_SCHEMA
from simulator.scenario_limits import MAX_DURATION, MAX_NUM_SEQS, MAX_REPLICAS
from simulator.scenario_schema import DIST, POOL, ROUTER, SECONDS, SLO, SLO_NAMES, TOKENS, WORKLOAD

# a deployment is a pool without a replica count or an autoscaler: the planner chooses those
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill")
POOL_KEYS = ("latency_model", "max_model_len", "kv_blocks", "kv_memory", "kv_offload", "block_size",
             "prefix_caching", "step_overhead_ms", "wakeup_ms", "labels", *ENGINE_KEYS)


def grid(item: dict) -> dict:
    return {"type": "array", "minItems": 1, "maxItems": 16, "items": item}


DEPLOYMENT = mapping(
    {
        "name": {**STR, "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"},
        "gpus_per_replica": at_most(COUNT1, 1024),
        "price_per_gpu_hour": at_most(POS, 1e6),
        **{k: POOL["properties"][k] for k in POOL_KEYS},
    },
    ("name", "latency_model", "price_per_gpu_hour"),
    allOf=[{"x-at-most-one": ["kv_blocks", "kv_memory"]}],
)

POLICY = mapping(
    {
        "name": {**STR, "pattern": "^[A-Za-z0-9][A-Za-z0-9._ -]*$"},
        "spec": {"type": ["string", "object"], "x-message": "must be a file path or an inline spec"},
        "latency_model": POOL["properties"]["latency_model"],
    },
    ("name", "spec"),
)

# the P:D search (simulator.planner.pd_plan): the scenario's pd section without the pool names, the load
# levels (fractions of the peak) and a deployment per role
PD = mapping({
    **{k: v for k, v in PD_SCHEMA["properties"].items() if k not in ("prefill_pool", "decode_pool")},
    "levels": {"type": "array", "minItems": 1, "maxItems": 16,
               "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
    "prefill_deployment": STR,
    "decode_deployment": STR,
}, ("link",))

PLAN = mapping(
    {
        "name": STR,
        "seeds": {"type": "array", "minItems": 1, "maxItems": 32, "items": COUNT0},
        "duration": SECONDS,  # of the curve, before compression
        "workload": WORKLOAD,
        "growth": at_most(POS, 1000),  # every rate times this
        "compress": at_most({"type": "number", "minimum": 1}, 3600),  # the curve played this much faster
        "slo": mapping({name: SLO for name in SLO_NAMES}, **{"minProperties": 1}),
        "startup_delay": DIST,  # from a scale-up to the new replica serving
        "router": ROUTER,
        "currency": {"type": "string", "minLength": 1, "maxLength": 16},
        "deployments": {"type": "array", "minItems": 1, "maxItems": 64, "items": DEPLOYMENT},
        "engine": mapping({
            "max_num_seqs": grid(at_most(COUNT1, MAX_NUM_SEQS)),
            "max_num_batched_tokens": grid(TOKENS),
            "chunked_prefill": grid(POOL["properties"]["chunked_prefill"]),
        }),
        "policies": {"type": "array", "maxItems": 32, "items": POLICY},
        "autoscale": {"enum": ["all", "cheapest_per_deployment"]},
        "pd": PD,
        "search": mapping({
            "start_rate": at_most(POS, 1e4),  # req/s a replica is tried at first
            "step": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.05},
            "duration": at_most(SECONDS, 86400),  # of each capacity run
            "peak_duration": at_most(SECONDS, 86400),  # of each run at the peak (default: duration)
            # a peak run whose queue still rises is run twice as long, up to this (simulator.planner.steady)
            "max_duration": at_most(SECONDS, 86400),
            # the static fleets that may be the answer are run this long at the peak before it is given
            "check_duration": at_most(SECONDS, 86400),
            "drain": at_most({"type": "number", "minimum": 0}, MAX_DURATION),
            "max_replicas": at_most(COUNT1, MAX_REPLICAS),
        }),
    },
    ("workload", "slo", "deployments"),
)
