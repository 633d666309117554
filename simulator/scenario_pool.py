"""A scenario's pool: its spec (PoolSpec, FailureSpec) and how a `pools[]` entry becomes one, with the
settings a latency model recorded (settings_from_model, frontend_from_model, a derived model's KV).
Errors name the file, line and field; simulator.scenario reads the whole file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.yamlfile import Document
from engine.core.scheduler import whole_prefill_error
from simulator.dists import Dist
from simulator.frontend import frontend_from_provenance
from simulator.kvtier import OffloadSpec, offload_config
from simulator.latency.loader import is_derived, model_ref
from simulator.scenario_autoscaler import autoscaler_entry
from simulator.scenario_limits import MAX_KV_BLOCKS, MAX_NUM_SEQS
from simulator.scenario_schema import dist_at, resolve


def no_delay() -> Dist:
    return Dist("constant", {"value": 0.0})


@dataclass
class FailureSpec:
    mtbf: float  # mean seconds between failures of one replica (exponential)
    repair: Dist = field(default_factory=no_delay)  # seconds until a replacement is provisioned
    on_failure: str = "retry"  # retry: in-flight requests are re-routed; drop: they fail


@dataclass
class PoolSpec:
    name: str
    latency_model: str
    replicas: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    kv_blocks: int | None = None
    kv_memory: dict | None = None
    block_size: int = 16
    prefix_caching: bool = True
    chunked_prefill: bool = True  # off: each prompt computed whole in one step
    provisioning_delay: Dist = field(default_factory=no_delay)  # from a scale-up to the replica serving
    cost_per_hour: float = 0.0
    step_overhead_ms: float = 0.0  # engine time per step outside the model (scheduling, output handling)
    wakeup_ms: float = 0.0  # from an arrival at an idle replica to its first step (the loop's wake-up)
    frontend: dict | None = None  # the HTTP front end: each request's delay drawn from it (frontend.py)
    failure: FailureSpec | None = None
    autoscaler: dict | None = None
    labels: dict = field(default_factory=dict)  # its engines' series labels (model_name, namespace, pod)
    kv_offload: OffloadSpec | None = None  # a host-memory tier behind the KV cache (simulator.kvtier)

    @property
    def startup_delay(self) -> Dist:
        """The older name of provisioning_delay, read-only, while readers move to the new name."""
        return self.provisioning_delay

    def num_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        m = self.kv_memory
        free = m["gpu_memory_gib"] * m["num_gpus"] * m["utilization"] - m["weights_gib"]
        tokens = free * 2**30 / m["kv_bytes_per_token"]
        if tokens < self.block_size:
            raise ValueError(f"pool {self.name}: kv_memory leaves no room for the KV cache")
        return int(tokens // self.block_size)


def given(data: dict, fields: dict) -> dict:
    """{attribute: value} for the keys the file sets (fields: key -> (attribute, type)); the dataclass
    holds the defaults of the others."""
    return {attr: kind(data[key]) for key, (attr, kind) in fields.items() if key in data}


POOL_FIELDS = {
    k: (k, kind)
    for k, kind in {
        "replicas": int,
        "max_num_seqs": int,
        "max_num_batched_tokens": int,
        "max_model_len": int,
        "kv_blocks": int,
        "block_size": int,
        "prefix_caching": bool,
        "chunked_prefill": bool,
        "cost_per_hour": float,
        "step_overhead_ms": float,
        "wakeup_ms": float,
    }.items()
}


def pool_spec(doc: Document, base: Path, top: Document) -> PoolSpec:
    """A `pools[]` entry (`top`: the whole scenario, for its default autoscaler) as a PoolSpec."""
    p = doc.data
    kw = given(p, POOL_FIELDS)
    lm = model_ref(p["latency_model"])
    if "/" in lm or lm.endswith(".json"):
        lm = resolve(lm, base)
    if is_derived(lm) and "kv_blocks" not in p and "kv_memory" not in p:
        kw = {**_derived_kv(doc, lm), **kw}  # the KV cache its GPUs' memory leaves
    if p.get("settings_from_model"):
        kw = {**_model_settings(doc, lm, "kv_memory" not in p), **kw}  # the pool's own fields win
    if p.get("frontend_from_model"):
        kw["frontend"] = _model_frontend(doc, lm)
    if "kv_memory" in p:
        km = p["kv_memory"]
        kw["kv_memory"] = {
            "gpu_memory_gib": float(km["gpu_memory_gib"]),
            "num_gpus": int(km.get("num_gpus", 1)),
            "weights_gib": float(km["weights_gib"]),
            "kv_bytes_per_token": float(km["kv_bytes_per_token"]),
            "utilization": float(km.get("utilization", 0.9)),
        }
    for key in ("provisioning_delay", "startup_delay"):  # the schema allows one of them
        if key in p:
            kw["provisioning_delay"] = dist_at(doc, key)
    if "failure" in p:
        f = doc.at("failure")
        repair = {"repair": dist_at(f, "repair")} if "repair" in f.data else {}
        on_failure = given(f.data, {"on_failure": ("on_failure", str)})
        kw["failure"] = FailureSpec(float(f.data["mtbf"]), **repair, **on_failure)
    scaler = None  # the pool's own autoscaler, else the scenario's
    if "autoscaler" in p or "autoscaler" in top.data:
        scaler = autoscaler_entry(doc.at("autoscaler") if "autoscaler" in p else top.at("autoscaler"), base)
    if "labels" in p:
        kw["labels"] = {k: str(v) for k, v in p["labels"].items()}
    pool = PoolSpec(p["name"], lm, **kw, autoscaler=scaler)
    if not pool.chunked_prefill and "max_num_batched_tokens" not in kw:  # as vLLM: room for a whole prompt
        pool.max_num_batched_tokens = max(pool.max_num_batched_tokens, pool.max_model_len)
    if pool.kv_blocks is None and pool.kv_memory is None:
        pool.kv_blocks = 1 + pool.max_model_len // pool.block_size * 8  # room for a few full-length requests
    try:
        blocks = pool.num_kv_blocks()
    except ValueError:
        raise doc.error(("kv_memory",), "leaves no room for the KV cache") from None
    if "kv_offload" in p:  # its price is part of the replica's hourly cost
        pool.kv_offload = offload_config(doc.at("kv_offload"), pool.block_size, pool.kv_memory, lm,
                                         pool.prefix_caching)
        pool.cost_per_hour += pool.kv_offload.cost_per_hour
    if blocks > MAX_KV_BLOCKS:
        key = "kv_memory" if pool.kv_memory is not None else "max_model_len"
        raise doc.error((key,), f"gives {blocks} KV blocks a replica, more than the limit of {MAX_KV_BLOCKS}")
    if not pool.chunked_prefill:  # the scheduler's own rule, on the length it will use
        model_len = min(pool.max_model_len, blocks * pool.block_size)
        error = whole_prefill_error(pool.max_num_batched_tokens, model_len)
        if error:
            raise doc.error(("max_num_batched_tokens",), error)
    return pool


# a calibrated server's recorded setting -> the pool field it sets
MODEL_SETTINGS = {"max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                  "max_model_len": "max_model_len", "num_kv_blocks": "kv_blocks", "block_size": "block_size",
                  "enable_prefix_caching": "prefix_caching", "enable_chunked_prefill": "chunked_prefill"}


def _derived_kv(doc: Document, lm: str) -> dict:
    """kv_blocks and block_size of a derived model (its memory after weights, activations, reserve)."""
    settings = _recorded(doc, lm, "latency_model").engine_settings
    size = int(doc.data.get("block_size", settings["block_size"]))  # the same bytes in the pool's blocks
    return {"kv_blocks": max(int(settings["num_kv_blocks"]) * int(settings["block_size"]) // size, 1),
            "block_size": size}


def _recorded(doc: Document, lm: str, key: str):
    """The latency model a `..._from_model` option reads; a file it cannot read is named at that key."""
    from simulator.latency import load_latency_model

    try:
        return load_latency_model(lm)
    except (OSError, ValueError) as exc:
        raise doc.error((key,), f"cannot read the latency model: {exc}") from None


def _model_settings(doc: Document, lm: str, kv_blocks: bool) -> dict:
    """The scheduling settings a latency model recorded of the server it was calibrated on."""
    recorded = _recorded(doc, lm, "settings_from_model").engine_settings
    out = {MODEL_SETTINGS[k]: v for k, v in recorded.items() if k in MODEL_SETTINGS}
    if not kv_blocks:
        out.pop("kv_blocks", None)
    limits = {"max_num_seqs": MAX_NUM_SEQS, "kv_blocks": MAX_KV_BLOCKS}
    for key, value in out.items():
        if isinstance(value, bool) != (key == "prefix_caching") or (key != "prefix_caching" and value < 1):
            raise doc.error(("settings_from_model",), f"the latency model records {key} = {value!r}")
        if value > limits.get(key, value):
            raise doc.error(("settings_from_model",), f"the latency model records {key} = {value}, more "
                            f"than the limit of {limits[key]}")
    return out


def _model_frontend(doc: Document, lm: str) -> dict:
    """The front end a black-box calibration measured (calibrate --from-server): its delay's quantiles."""
    try:
        return frontend_from_provenance(_recorded(doc, lm, "frontend_from_model").provenance)
    except ValueError as exc:
        raise doc.error(("frontend_from_model",), str(exc)) from None
