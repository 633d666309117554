"""Scenario files: what to simulate, validated strictly.

    sc = load_scenario("examples/x.yaml")      # a path, YAML text, or a dict built in code

The file is parsed by the one safe YAML loader and checked against simulator.scenario_schema; every
error names the file, line and field (`examples/x.yaml:14: pools[0].max_num_seqs: must be >= 1, got 0`).
Relative paths (latency models, traces, autoscaler specs) resolve against the scenario file's folder,
and autoscaler specs are validated here too, so a bad spec is reported before the run starts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.schedule import SchedulePolicy
from autoscaler.slo import SloTarget
from autoscaler.spec import load_spec
from autoscaler.validation import check, problems
from autoscaler.yamlfile import Document, document, dotted, parse
from engine.core.scheduler import whole_prefill_error
from promql import PromQLError, compile_query
from promql.rules import RuleGroup, rule_groups
from routing.flow import Band, SaturationDetector
from routing.router import Router
from simulator.dists import Dist
from simulator.frontend import frontend_from_provenance
from simulator.kvtier import OffloadSpec, offload_config
from simulator.latency.loader import is_derived, model_ref
from simulator.pd_spec import PDSpec, pd_config
from simulator.scenario_limits import (
    MAX_DURATION,
    MAX_KV_BLOCKS,
    MAX_NUM_SEQS,
    MAX_REPLICAS,
    MIN_INTERVAL,
    MIN_SCRAPE_INTERVAL,
    check_limits,
)
from simulator.scenario_schema import ROUTERS, SCENARIO, SLO_NAMES, dist_at, resolve
from simulator.scenario_workload import workload_config

__all__ = ["ROUTERS", "SLO_NAMES", "FailureSpec", "PoolSpec", "Scenario", "SloTarget", "load_scenario"]


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


@dataclass
class Scenario:
    workload: dict
    pools: list[PoolSpec]
    duration: float | None
    router: dict
    slos: list[SloTarget]
    seed: int = 0
    warmup: float = 0.0  # SLO statistics count requests arriving from this time on
    scrape_interval: float = 15.0
    rate_window: float = 60.0
    timeline_interval: float = 10.0
    drain_after_end: bool = True  # keep running after the last arrival until requests finish
    max_drain: float = 3600.0
    base_dir: Path = Path(".")
    name: str = "scenario"
    currency: str = "USD"  # of the pools' cost_per_hour, for the report
    rules: list[RuleGroup] = field(default_factory=list)  # Prometheus recording rules
    evaluation_interval: float = 60.0  # Prometheus' default global evaluation_interval
    pd: PDSpec | None = None  # a disaggregated service over two of the pools (simulator.pd)


def _given(data: dict, fields: dict) -> dict:
    """{attribute: value} for the keys the file sets (fields: key -> (attribute, type)); the dataclass
    holds the defaults of the others."""
    return {attr: kind(data[key]) for key, (attr, kind) in fields.items() if key in data}


def load_scenario(source: str | Path | dict | Document, base_dir: Path | None = None,
                  duration: float | None = None) -> Scenario:
    """A scenario from a YAML file path, YAML text, a dict or a parsed Document; `duration` replaces
    the file's (a command line's --duration), checked against the same limits."""
    name = "scenario"
    if isinstance(source, (dict, Document)):
        doc = document(source)
    else:
        p = Path(source)
        if "\n" not in str(source) and p.exists():
            base_dir = base_dir or p.resolve().parent
            name = p.stem
            try:
                text = p.read_text()
            except UnicodeDecodeError as exc:
                raise ValueError(f"{source}: not UTF-8 text ({exc})") from None
            doc = parse(text, str(source))
        elif isinstance(source, str) and ("\n" in source or ":" in source):
            doc = parse(source)
        else:
            raise FileNotFoundError(f"scenario file not found: {source}")
    if not isinstance(doc.data, dict):
        raise doc.error((), "a scenario must be a mapping with workload and pools")
    if duration is not None:
        if problems(SCENARIO["properties"]["duration"], duration):
            raise ValueError(f"duration {duration!r} (in place of the file's): must be a number > 0 and "
                             f"<= {MAX_DURATION:.0f} s")
        doc = Document({**doc.data, "duration": duration}, doc.name, doc.node, doc.prefix)
    check(SCENARIO, doc)
    d = doc.data
    base = base_dir or Path(".")
    workload = workload_config(doc.at("workload"), base)
    if "duration" not in d and "trace" not in workload:
        raise doc.error(("duration",), "is required for a generated workload")
    pools = [_pool(doc.at("pools", i), base, doc) for i in range(len(d["pools"]))]
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise doc.error(("pools",), f"pool names must be unique, got {names}")
    sections = {k: d.get(k, {}) for k in ("metrics", "output", "drain")}
    sc = Scenario(
        workload=workload,
        pools=pools,
        duration=float(d["duration"]) if "duration" in d else None,
        router=_router(d.get("router", {})),
        slos=[SloTarget.from_yaml(metric, v) for metric, v in d.get("slo", {}).items()],
        base_dir=base,
        name=str(d.get("name", name)),
        **_given(d, {"seed": ("seed", int), "currency": ("currency", str), "warmup": ("warmup", float)}),
        **_given(sections["metrics"], {"scrape_interval": ("scrape_interval", float)}),
        **_given(sections["metrics"], {"rate_window": ("rate_window", float)}),
        **_given(sections["metrics"], {"evaluation_interval": ("evaluation_interval", float)}),
        rules=_rules(doc.at("metrics"), base) if "metrics" in d else [],
        **_given(sections["output"], {"timeline_interval": ("timeline_interval", float)}),
        **_given(sections["drain"], {"enabled": ("drain_after_end", bool), "max": ("max_drain", float)}),
        pd=pd_config(doc.at("pd"), pools, doc) if "pd" in d else None,
    )
    if sc.warmup and sc.duration is not None and sc.warmup >= sc.duration:
        raise doc.error(("warmup",), f"must be below the duration ({sc.duration:g} s), got {sc.warmup:g}")
    span = (sc.duration or 0.0) + (sc.max_drain if sc.drain_after_end else 0.0)
    check_limits(doc, workload, sc.duration, span, pools, sc.scrape_interval, sc.rate_window,
                 sc.timeline_interval, sc.router)
    return sc


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


def _pool(doc: Document, base: Path, top: Document) -> PoolSpec:
    p = doc.data
    kw = _given(p, POOL_FIELDS)
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
        on_failure = _given(f.data, {"on_failure": ("on_failure", str)})
        kw["failure"] = FailureSpec(float(f.data["mtbf"]), **repair, **on_failure)
    scaler = None  # the pool's own autoscaler, else the scenario's
    if "autoscaler" in p or "autoscaler" in top.data:
        scaler = _autoscaler(doc.at("autoscaler") if "autoscaler" in p else top.at("autoscaler"), base)
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


SCHEDULE_POLLING = inspect.signature(SchedulePolicy).parameters["polling_interval"].default


def _autoscaler(doc: Document, base: Path) -> dict:
    """The pool's autoscaler entry: fixed, a schedule, or a policy spec (a file or inline)."""
    entry = _autoscaler_entry(doc, base)
    if entry["kind"] == "spec":
        spec = entry["spec"]
        _check_queries(doc, spec)
        if spec.max_replicas > MAX_REPLICAS:
            raise doc.error((), f"the spec's maximum of {spec.max_replicas} replicas is more than the limit "
                            f"of {MAX_REPLICAS}")
        if spec.polling_interval < MIN_INTERVAL:
            raise doc.error((), f"the spec's polling interval of {spec.polling_interval:g} s is less than "
                            f"the limit of {MIN_INTERVAL} s")
    return entry


def _autoscaler_entry(doc: Document, base: Path) -> dict:
    a, where = doc.data, dotted(doc.prefix)
    if "apiVersion" in a or "kind" in a:  # a whole spec inline
        return {"kind": "spec", "spec": load_spec(doc), "latency_model": None, "where": where}
    if "fixed" in a:
        return {"kind": "fixed", "replicas": int(a["fixed"])}
    if "schedule" in a:
        steps: list[tuple[float, int]] = []
        for i, r in enumerate(a["schedule"]):
            if steps and r["at"] < steps[-1][0]:
                raise doc.error(("schedule", i, "at"), "times must be non-decreasing")
            steps.append((float(r["at"]), int(r["replicas"])))
        polling = a.get("polling_interval", SCHEDULE_POLLING)
        return {"kind": "schedule", "steps": steps, "polling_interval": float(polling)}
    lm = model_ref(a["latency_model"]) if a.get("latency_model") else None
    if lm and ("/" in lm or lm.endswith(".json")):
        lm = resolve(lm, base)
    if isinstance(a["spec"], dict):
        return {"kind": "spec", "spec": load_spec(doc.at("spec")), "latency_model": lm, "where": where}
    path = resolve(a["spec"], base)
    if not Path(path).is_file():
        raise doc.error(("spec",), f"file not found: {path}")
    try:
        spec = load_spec(Path(path).read_text(), path=path)
    except ValueError as exc:
        raise doc.error(("spec",), str(exc)) from None
    return {"kind": "spec", "spec": spec, "path": path, "latency_model": lm, "where": where}


def _rules(doc: Document, base: Path) -> list[RuleGroup]:
    """The recording rules of metrics.rule_files and metrics.rules, their errors naming the field."""
    groups: list[RuleGroup] = []
    for i, f in enumerate(doc.data.get("rule_files", [])):
        path = Path(resolve(f, base))
        try:
            groups += rule_groups(parse(path.read_text(), str(path)).data, str(path))
        except FileNotFoundError:
            raise doc.error(("rule_files", i), f"file not found: {path}") from None
        except ValueError as exc:
            raise doc.error(("rule_files", i), str(exc)) from None
    if "rules" in doc.data:
        try:
            groups += rule_groups(doc.data["rules"], "rules")
        except ValueError as exc:
            raise doc.error(("rules",), str(exc)) from None
    for g in groups:  # a group's evaluations over the run are bounded as the scrapes are
        if g.interval is not None and g.interval < MIN_SCRAPE_INTERVAL * 1000:
            raise doc.error((), f"rule group {g.name!r}: interval {g.interval} ms is less than the limit "
                            f"of {MIN_SCRAPE_INTERVAL} s")
    names = [g.name for g in groups]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise doc.error((), f"rule group(s) {', '.join(twice)} defined more than once")
    return groups


def _check_queries(doc: Document, spec) -> None:
    """Every trigger query of a spec parses and uses only what the simulator's evaluator answers."""
    for trig in spec.triggers:
        try:
            tree = compile_query(trig.query)
        except PromQLError as exc:
            raise doc.error((), f"trigger {trig.name!r}: {exc}") from None
        if tree.type == "matrix":
            raise doc.error((), f"trigger {trig.name!r}: query {trig.query!r} gives a range vector; a "
                            "trigger needs an instant vector or a scalar")


ROUTER_DEFAULTS = {
    k: inspect.signature(Router).parameters[k].default
    for k in ("policy", "prefix_lru_blocks", "kv_threshold", "queue_threshold")
}
WEIGHTED_DEFAULT = {"prefix": 2.0, "kv": 1.0, "queue": 1.0}  # the weighted policy without weights


def _router(r: dict) -> dict:
    o = {**ROUTER_DEFAULTS, "weights": {}, "latency_ms": 0.0, **r}
    weights = o["weights"] or (WEIGHTED_DEFAULT if o["policy"] == "weighted" else {})
    return {
        "policy": o["policy"],
        "weights": {k: float(v) for k, v in weights.items()},
        "prefix_lru_blocks": int(o["prefix_lru_blocks"]),
        "kv_threshold": float(o["kv_threshold"]),
        "queue_threshold": int(o["queue_threshold"]),
        # from a client's send to the request's arrival at a replica (network, gateway, HTTP parsing);
        # part of every TTFT and E2E
        "latency_ms": float(o["latency_ms"]),
        **({"flow_control": _flow_control(o["flow_control"])} if "flow_control" in o else {}),
    }


def _flow_control(f: dict) -> dict:
    """The gateway queue's settings, defaults filled (routing.flow)."""
    bands = [Band(int(b["priority"]), int(b.get("capacity", Band.capacity)), float(b.get("ttl", Band.ttl)),
                  str(b.get("name", "")), float(b.get("saturation", Band.saturation)))
             for b in f.get("bands", [{"priority": 0}])]
    shares = [float(b.get("share", 1.0 / len(bands))) for b in f.get("bands", [{"priority": 0}])]
    if len({b.priority for b in bands}) != len(bands):
        raise ValueError("router.flow_control.bands: priorities must be distinct")
    detector = SaturationDetector(int(f.get("queue_threshold", SaturationDetector.queue_threshold)),
                                  float(f.get("kv_threshold", SaturationDetector.kv_threshold)))
    interval = float(f.get("interval", 0.01))  # seconds between dispatch rounds as capacity frees
    return {"bands": bands, "shares": shares, "detector": detector, "interval": interval}
