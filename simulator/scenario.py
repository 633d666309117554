"""Scenario files: what to simulate, validated strictly.

Every unknown key and every bad value is rejected with a message naming its path in the file
(e.g. `pools[0].max_num_seqs: must be an integer >= 1`). Relative paths (latency models, traces,
autoscaler specs) are resolved against the scenario file's folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simulator.dists import Dist, parse_dist

ROUTERS = (
    "round_robin",
    "random",
    "least_outstanding",
    "least_waiting",
    "kv_aware",
    "prefix_affinity",
    "weighted",
)
SLO_NAMES = ("ttft", "tpot", "itl", "e2e")


def _check_keys(d, where: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"{where or 'scenario'}: must be a mapping")
    for k in d:
        if k not in allowed:
            raise ValueError(f"{_join(where, str(k))}: unknown key (allowed: {', '.join(sorted(allowed))})")
    for k in required:
        if k not in d:
            raise ValueError(f"{_join(where, k)}: required")
    return d


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _num(
    d: dict,
    key: str,
    where: str,
    default=None,
    lo: float | None = 0.0,
    strict: bool = False,
    integer: bool = False,
):
    if key not in d or d[key] is None:
        return default
    v = d[key]
    path = _join(where, key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not math.isfinite(v))
    ):
        raise ValueError(f"{path}: must be {'an integer' if integer else 'a number'}, got {v!r}")
    if integer and v != int(v):
        raise ValueError(f"{path}: must be an integer, got {v!r}")
    if lo is not None and (v <= lo if strict else v < lo):
        raise ValueError(f"{path}: must be {'>' if strict else '>='} {lo}, got {v}")
    return int(v) if integer else float(v)


def _str(d: dict, key: str, where: str, choices=None, default=None) -> str | None:
    if key not in d:
        return default
    v = d[key]
    if not isinstance(v, str):
        raise ValueError(f"{_join(where, key)}: must be a string, got {v!r}")
    if choices is not None and v not in choices:
        raise ValueError(f"{_join(where, key)}: must be one of {', '.join(choices)}, got {v!r}")
    return v


@dataclass
class FailureSpec:
    mtbf: float  # mean seconds between failures of one replica (exponential)
    repair: Dist  # seconds until a replacement is provisioned
    on_failure: str = "retry"  # retry: in-flight requests are re-routed; drop: they fail


@dataclass
class PoolSpec:
    name: str
    latency_model: str
    replicas: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    kv_blocks: int | None = None
    kv_memory: dict | None = None
    block_size: int = 16
    prefix_caching: bool = True
    startup_delay: Dist = field(default_factory=lambda: Dist("constant", {"value": 0.0}))
    cost_per_hour: float = 0.0
    step_overhead_ms: float = 0.0  # engine time per step outside the model (scheduling, output handling)
    wakeup_ms: float = 0.0  # from an arrival at an idle replica to its first step (the loop's wake-up)
    failure: FailureSpec | None = None
    autoscaler: dict | None = None

    def num_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        m = self.kv_memory
        free = m["gpu_memory_gib"] * m["num_gpus"] * m.get("utilization", 0.9) - m["weights_gib"]
        tokens = free * 2**30 / m["kv_bytes_per_token"]
        if tokens < self.block_size:
            raise ValueError(f"pool {self.name}: kv_memory leaves no room for the KV cache")
        return int(tokens // self.block_size)


@dataclass
class SLO:
    name: str
    threshold: float  # seconds
    percentile: float = 90.0


@dataclass
class Scenario:
    workload: dict
    pools: list[PoolSpec]
    duration: float | None
    router: dict
    slos: list[SLO]
    seed: int = 0
    scrape_interval: float = 15.0
    rate_window: float = 60.0
    timeline_interval: float = 10.0
    drain_after_end: bool = True  # keep running after the last arrival until requests finish
    max_drain: float = 3600.0
    base_dir: Path = Path(".")
    name: str = "scenario"


def load_scenario(source, base_dir: Path | None = None) -> Scenario:
    """A scenario from a YAML path, YAML text or a dict."""
    name = "scenario"
    if isinstance(source, dict):
        data = source
    else:
        p = Path(source)
        if "\n" not in str(source) and p.exists():
            base_dir = base_dir or p.resolve().parent
            name = p.stem
            text = p.read_text()
        elif isinstance(source, str) and ("\n" in source or ":" in source):
            text = source
        else:
            raise FileNotFoundError(f"scenario file not found: {source}")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{name}: invalid YAML: {exc}") from None
    base = base_dir or Path(".")
    d = _check_keys(
        data,
        "",
        {
            "name",
            "seed",
            "duration",
            "workload",
            "pools",
            "router",
            "autoscaler",
            "slo",
            "metrics",
            "output",
            "drain",
        },
        {"workload", "pools"},
    )
    workload = _workload(d["workload"], "workload", base)
    duration = _num(d, "duration", "", None, strict=True)
    if duration is None and "trace" not in workload:
        raise ValueError("duration: required for a generated workload")
    pools_raw = d["pools"]
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ValueError("pools: must be a non-empty list")
    pools = [_pool(p, f"pools[{i}]", base, d.get("autoscaler")) for i, p in enumerate(pools_raw)]
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pools: pool names must be unique, got {names}")
    router = _router(d.get("router", {"policy": "least_outstanding"}), "router")
    slos = _slos(d.get("slo", {}), "slo")
    m = _check_keys(d.get("metrics", {}), "metrics", {"scrape_interval", "rate_window"})
    o = _check_keys(d.get("output", {}), "output", {"timeline_interval"})
    dr = _check_keys(d.get("drain", {}), "drain", {"enabled", "max"})
    if "enabled" in dr and not isinstance(dr["enabled"], bool):
        raise ValueError("drain.enabled: must be true or false")
    return Scenario(
        workload=workload,
        pools=pools,
        duration=duration,
        router=router,
        slos=slos,
        seed=_num(d, "seed", "", 0, integer=True),
        scrape_interval=_num(m, "scrape_interval", "metrics", 15.0, strict=True),
        rate_window=_num(m, "rate_window", "metrics", 60.0, strict=True),
        timeline_interval=_num(o, "timeline_interval", "output", 10.0, strict=True),
        drain_after_end=dr.get("enabled", True),
        max_drain=_num(dr, "max", "drain", 3600.0),
        base_dir=base,
        name=str(d.get("name", name)),
    )


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def _trace_cfg(t, where: str, base: Path) -> dict:
    t = _check_keys(
        t,
        where,
        {
            "format",
            "path",
            "rate_scale",
            "time_scale",
            "start",
            "duration",
            "limit",
            "time_column",
            "prompt_column",
            "output_column",
            "time_unit",
        },
        {"format", "path"},
    )
    _str(t, "format", where, ("azure", "mooncake", "burstgpt", "csv"))
    _str(t, "path", where)
    for k in ("rate_scale", "time_scale", "time_unit"):
        _num(t, k, where, strict=True)
    _num(t, "start", where)
    _num(t, "duration", where, strict=True)
    _num(t, "limit", where, integer=True, lo=1)
    for k in ("time_column", "prompt_column", "output_column"):
        _str(t, k, where)
    return dict(t, path=_resolve(t["path"], base))


def _workload(w, where: str, base: Path) -> dict:
    w = _check_keys(
        w,
        where,
        {
            "trace",
            "arrivals",
            "prompt_tokens",
            "output_tokens",
            "lengths_from",
            "max_prompt_tokens",
            "max_output_tokens",
        },
    )
    out: dict = {}
    if "trace" in w:
        if "arrivals" in w:
            raise ValueError(f"{where}: give either trace or arrivals, not both")
        out["trace"] = _trace_cfg(w["trace"], f"{where}.trace", base)
    else:
        if "arrivals" not in w:
            raise ValueError(f"{where}.arrivals: required (or give a trace)")
        out["arrivals"] = _arrivals(w["arrivals"], f"{where}.arrivals")
        if "lengths_from" in w:
            out["lengths_from"] = _trace_cfg(w["lengths_from"], f"{where}.lengths_from", base)
        else:
            for k in ("prompt_tokens", "output_tokens"):
                if k not in w:
                    raise ValueError(f"{where}.{k}: required (or give lengths_from a trace)")
                out[k] = parse_dist(w[k], f"{where}.{k}", integer=True)
    for k in ("max_prompt_tokens", "max_output_tokens"):
        out[k] = _num(w, k, where, None, lo=1, integer=True)
    return out


def _arrivals(a, where: str) -> dict:
    a = _check_keys(a, where, {"process", "cv", "rate", "diurnal", "piecewise", "spikes"})
    process = _str(a, "process", where, ("poisson", "gamma"), "poisson")
    cv = _num(a, "cv", where, 1.0, strict=True)
    if process == "poisson" and "cv" in a and cv != 1.0:
        raise ValueError(f"{where}.cv: a poisson process has cv 1; use process: gamma")
    if process == "gamma" and "cv" not in a:
        raise ValueError(f"{where}.cv: required for process: gamma")
    shapes = [k for k in ("rate", "diurnal", "piecewise") if k in a]
    if len(shapes) != 1:
        raise ValueError(f"{where}: give exactly one of rate, diurnal, piecewise (got {shapes or 'none'})")
    out = {"cv": cv, "spikes": []}
    if "rate" in a:
        out["curve"] = {"kind": "constant", "rate": _num(a, "rate", where, strict=True)}
    elif "diurnal" in a:
        dw = f"{where}.diurnal"
        dd = _check_keys(a["diurnal"], dw, {"mean", "amplitude", "period", "phase"}, {"mean"})
        amp = _num(dd, "amplitude", dw, 0.5)
        if amp > 1:
            raise ValueError(f"{dw}.amplitude: must be in [0, 1], got {amp}")
        out["curve"] = {
            "kind": "diurnal",
            "mean": _num(dd, "mean", dw, strict=True),
            "amplitude": amp,
            "period": _num(dd, "period", dw, 86400.0, strict=True),
            "phase": _num(dd, "phase", dw, 0.0),
        }
    else:
        pts = a["piecewise"]
        pw = f"{where}.piecewise"
        if not isinstance(pts, list) or len(pts) < 1:
            raise ValueError(f"{pw}: must be a list of [time_s, rate] points")
        points = []
        for i, p in enumerate(pts):
            if isinstance(p, dict):
                p = _check_keys(p, f"{pw}[{i}]", {"at", "rate"}, {"at", "rate"})
                p = [p["at"], p["rate"]]
            if not isinstance(p, (list, tuple)) or len(p) != 2:
                raise ValueError(f"{pw}[{i}]: must be [time_s, rate] or {{at, rate}}")
            t = _num({"t": p[0]}, "t", f"{pw}[{i}]")
            r = _num({"r": p[1]}, "r", f"{pw}[{i}]")
            if points and t < points[-1][0]:
                raise ValueError(f"{pw}[{i}]: times must be non-decreasing")
            points.append((t, r))
        out["curve"] = {"kind": "piecewise", "points": points}
    spikes = a.get("spikes", [])
    if not isinstance(spikes, list):
        raise ValueError(f"{where}.spikes: must be a list")
    for i, s in enumerate(spikes):
        sw = f"{where}.spikes[{i}]"
        s = _check_keys(s, sw, {"at", "duration", "factor", "ramp"}, {"at", "duration", "factor"})
        out["spikes"].append(
            {
                "at": _num(s, "at", sw),
                "duration": _num(s, "duration", sw, strict=True),
                "factor": _num(s, "factor", sw),
                "ramp": _num(s, "ramp", sw, 0.0),
            }
        )
    return out


def _pool(p, where: str, base: Path, default_autoscaler) -> PoolSpec:
    p = _check_keys(
        p,
        where,
        {
            "name",
            "latency_model",
            "replicas",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "kv_blocks",
            "kv_memory",
            "block_size",
            "prefix_caching",
            "startup_delay",
            "cost_per_hour",
            "step_overhead_ms",
            "wakeup_ms",
            "failure",
            "autoscaler",
        },
        {"name", "latency_model"},
    )
    name = _str(p, "name", where)
    lm = _str(p, "latency_model", where)
    if "/" in lm or lm.endswith(".json"):
        lm = _resolve(lm, base)
    if "kv_blocks" in p and "kv_memory" in p:
        raise ValueError(f"{where}: give kv_blocks or kv_memory, not both")
    kv_memory = None
    if "kv_memory" in p:
        kw = f"{where}.kv_memory"
        km = _check_keys(
            p["kv_memory"],
            kw,
            {"gpu_memory_gib", "num_gpus", "weights_gib", "kv_bytes_per_token", "utilization"},
            {"gpu_memory_gib", "weights_gib", "kv_bytes_per_token"},
        )
        kv_memory = {
            "gpu_memory_gib": _num(km, "gpu_memory_gib", kw, strict=True),
            "num_gpus": _num(km, "num_gpus", kw, 1, lo=1, integer=True),
            "weights_gib": _num(km, "weights_gib", kw),
            "kv_bytes_per_token": _num(km, "kv_bytes_per_token", kw, strict=True),
            "utilization": _num(km, "utilization", kw, 0.9, strict=True),
        }
        if kv_memory["utilization"] > 1:
            raise ValueError(f"{kw}.utilization: must be in (0, 1]")
    if "prefix_caching" in p and not isinstance(p["prefix_caching"], bool):
        raise ValueError(f"{where}.prefix_caching: must be true or false")
    failure = None
    if "failure" in p:
        fw = f"{where}.failure"
        f = _check_keys(p["failure"], fw, {"mtbf", "repair", "on_failure"}, {"mtbf"})
        failure = FailureSpec(
            _num(f, "mtbf", fw, strict=True),
            parse_dist(f.get("repair", 0.0), f"{fw}.repair"),
            _str(f, "on_failure", fw, ("retry", "drop"), "retry"),
        )
    autoscaler = p.get("autoscaler", default_autoscaler)
    if autoscaler is not None:
        autoscaler = _autoscaler(
            autoscaler, f"{where}.autoscaler" if "autoscaler" in p else "autoscaler", base
        )
    pool = PoolSpec(
        name=name,
        latency_model=lm,
        replicas=_num(p, "replicas", where, 1, integer=True),
        max_num_seqs=_num(p, "max_num_seqs", where, 256, lo=1, integer=True),
        max_num_batched_tokens=_num(p, "max_num_batched_tokens", where, 8192, lo=1, integer=True),
        max_model_len=_num(p, "max_model_len", where, 32768, lo=1, integer=True),
        kv_blocks=_num(p, "kv_blocks", where, None, lo=1, integer=True),
        kv_memory=kv_memory,
        block_size=_num(p, "block_size", where, 16, lo=1, integer=True),
        prefix_caching=p.get("prefix_caching", True),
        startup_delay=parse_dist(p.get("startup_delay", 0.0), f"{where}.startup_delay"),
        cost_per_hour=_num(p, "cost_per_hour", where, 0.0),
        step_overhead_ms=_num(p, "step_overhead_ms", where, 0.0),
        wakeup_ms=_num(p, "wakeup_ms", where, 0.0),
        failure=failure,
        autoscaler=autoscaler,
    )
    if pool.kv_blocks is None and pool.kv_memory is None:
        pool.kv_blocks = 1 + pool.max_model_len // pool.block_size * 8  # room for a few full-length requests
    pool.num_kv_blocks()
    return pool


def _autoscaler(a, where: str, base: Path) -> dict:
    if not isinstance(a, dict):
        raise ValueError(f"{where}: must be a mapping")
    if "fixed" in a:
        _check_keys(a, where, {"fixed"})
        return {"kind": "fixed", "replicas": _num(a, "fixed", where, integer=True)}
    if "schedule" in a:
        _check_keys(a, where, {"schedule", "polling_interval"})
        rows = a["schedule"]
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"{where}.schedule: must be a non-empty list of {{at, replicas}}")
        steps = []
        for i, r in enumerate(rows):
            rw = f"{where}.schedule[{i}]"
            r = _check_keys(r, rw, {"at", "replicas"}, {"at", "replicas"})
            steps.append((_num(r, "at", rw), _num(r, "replicas", rw, integer=True)))
            if len(steps) > 1 and steps[-1][0] < steps[-2][0]:
                raise ValueError(f"{rw}.at: times must be non-decreasing")
        return {
            "kind": "schedule",
            "steps": steps,
            "polling_interval": _num(a, "polling_interval", where, 1.0, strict=True),
        }
    if "spec" in a:
        _check_keys(a, where, {"spec", "latency_model"})
        spec = a["spec"]
        if isinstance(spec, str):
            spec = {"path": _resolve(spec, base)}
        elif isinstance(spec, dict):
            spec = {"inline": spec}
        else:
            raise ValueError(f"{where}.spec: must be a file path or an inline spec mapping")
        lm = a.get("latency_model")
        if lm is not None and not isinstance(lm, str):
            raise ValueError(f"{where}.latency_model: must be a string")
        if lm and ("/" in lm or lm.endswith(".json")):
            lm = _resolve(lm, base)
        return {"kind": "spec", **spec, "latency_model": lm, "where": where}
    if "apiVersion" in a or "kind" in a:  # a whole spec inline
        return {"kind": "spec", "inline": a, "latency_model": None, "where": where}
    raise ValueError(f"{where}: give one of fixed, schedule, spec (a file path or an inline mapping)")


def _router(r, where: str) -> dict:
    r = _check_keys(
        r, where, {"policy", "weights", "prefix_lru_blocks", "kv_threshold", "queue_threshold", "latency_ms"}
    )
    policy = _str(r, "policy", where, ROUTERS, "least_outstanding")
    weights = r.get("weights", {})
    from simulator.router import SCORERS

    _check_keys(weights, f"{where}.weights", set(SCORERS))
    for k in weights:
        _num(weights, k, f"{where}.weights")
    if policy == "weighted" and not weights:
        weights = {"prefix": 2.0, "kv": 1.0, "queue": 1.0}
    return {
        "policy": policy,
        "weights": {k: float(v) for k, v in weights.items()},
        "prefix_lru_blocks": _num(r, "prefix_lru_blocks", where, 100_000, lo=1, integer=True),
        "kv_threshold": _num(r, "kv_threshold", where, 0.95, strict=True),
        "queue_threshold": _num(r, "queue_threshold", where, 64, lo=0, integer=True),
        # from a client's send to the request's arrival at a replica (network, gateway, HTTP parsing);
        # part of every TTFT and E2E
        "latency_ms": _num(r, "latency_ms", where, 0.0),
    }


def _slos(s, where: str) -> list[SLO]:
    s = _check_keys(s, where, set(SLO_NAMES))
    out = []
    for name, v in s.items():
        sw = f"{where}.{name}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = {"threshold": v}
        v = _check_keys(v, sw, {"threshold", "percentile"}, {"threshold"})
        pct = _num(v, "percentile", sw, 90.0, strict=True)
        if pct > 100:
            raise ValueError(f"{sw}.percentile: must be in (0, 100], got {pct}")
        out.append(SLO(name, _num(v, "threshold", sw, strict=True), pct))
    return out
