"""A scenario's `router` block: the live router's config (routing.config.RouterConfig), which the fleet
builds its Router from as `slopilot route` does, and what only a simulation has (the network latency to
a replica; the share of requests in each flow-control band; how often the gateway dispatches).

    router: router.yaml                            # an EndpointPickerConfig file (`slopilot route -c`)
    router: {kind: EndpointPickerConfig, plugins: [...], schedulingProfiles: [...]}   # inline
    router: {config: router.yaml, latency_ms: 2}   # either, with the simulation's own latency
    router: {policy: weighted, weights: {prefix: 2, queue: 1}}   # the shorthand

The shorthand is translated into a RouterConfig too (its ties in turn, its gateway detector's thresholds
its own, as before). With an EndpointPickerConfig every simulated request carries its defaultPriority
(the live router's priority for a request without a priority header or objective).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.schema_parts import COUNT0, COUNT1, FRACTION, NONNEG, POS, STR, at_least, at_most, mapping
from autoscaler.yamlfile import Document, document
from routing.config import RouterConfig, load_router_config
from routing.config_schema import keys as epp_keys
from routing.flow import Band, GatewayQueue, SaturationDetector
from routing.pickers import POLICY_NAMES
from routing.precise import uses_index
from routing.router import Router
from routing.scorers import WEIGHTS_SCHEMA
from simulator.scenario_limits import MAX_DURATION, MAX_LRU_BLOCKS, MAX_REQUESTS, MIN_INTERVAL

ROUTER_DEFAULTS = {
    k: inspect.signature(Router).parameters[k].default
    for k in ("policy", "prefix_lru_blocks", "kv_threshold", "queue_threshold")
}
WEIGHTED_DEFAULT = {"prefix": 2.0, "kv": 1.0, "queue": 1.0}  # the weighted policy without weights
SECONDS = at_most(POS, MAX_DURATION)
BESIDE_CONFIG = ("config", "latency_ms", "flow_control")  # flow_control: its interval only

ROUTER_SHORTHAND = mapping(
    {
        # the registered pickers and scorers: these two schema parts are the registries' own objects,
        # so a picker or scorer registered later is accepted too
        "policy": {"enum": POLICY_NAMES},
        "weights": WEIGHTS_SCHEMA,
        "prefix_lru_blocks": at_most(COUNT1, MAX_LRU_BLOCKS),
        "kv_threshold": POS,
        "queue_threshold": COUNT0,
        "latency_ms": NONNEG,
        # a gateway queue in front of the replicas (routing.flow): requests wait there while every
        # replica is saturated, highest band first; `share` is the fraction of requests in a band,
        # `saturation` the utilization under which a replica takes the band's requests (1: the thresholds)
        "flow_control": mapping({
            "queue_threshold": COUNT1,
            "kv_threshold": FRACTION,
            "interval": at_least(SECONDS, MIN_INTERVAL),
            "bands": {"type": "array", "minItems": 1, "items": mapping(
                {"priority": {"type": "integer"}, "name": STR, "capacity": at_most(COUNT1, MAX_REQUESTS),
                 "ttl": SECONDS,
                 "share": {"type": "number", "minimum": 0, "maximum": 1},
                 "saturation": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}, ("priority",))},
        }),
        # an EndpointPickerConfig in place of the fields above, but latency_ms and flow_control.interval
        "config": {"type": ["string", "object"], "minLength": 1,
                   "x-message": "must be an EndpointPickerConfig: its file's path or the mapping inline"},
    }
)
# the shorthand, or an EndpointPickerConfig (a path, or a mapping with its fields) routing.config checks
ROUTER = {
    "type": ["string", "object"],
    "x-message": "must be a mapping (policy, weights, ...), an EndpointPickerConfig or its file's path",
    "if": {"anyOf": [{"type": "string"}, *({"required": [k]} for k in epp_keys())]},
    "then": {"minLength": 1},
    "else": ROUTER_SHORTHAND,
}


@dataclass
class SimRouter:
    config: RouterConfig  # the router itself, as the live router reads it
    latency_ms: float = 0.0  # from a client's send to the arrival at a replica: part of every TTFT, E2E
    shares: list[float] = field(default_factory=lambda: [1.0])  # of the requests, per band in config.bands
    interval: float = 0.01  # seconds between the gateway's dispatch rounds as capacity frees


def router_config(doc: Document | dict | str | None = None, base: Path | None = None,
                  block_size: int | None = None) -> SimRouter:
    """The scenario's `router` block (a Document at it, already checked against ROUTER). `base`: the
    scenario's folder, for a config file's path; `block_size`: the replicas', which the precise
    prefix scorer's blockSize must equal. Errors name file, line and field."""
    doc = document({} if doc is None else doc)
    r = doc.data
    if isinstance(r, str) or any(k in r for k in epp_keys()):
        return _from_config(doc, (), base, block_size)
    if "config" not in r:
        return _shorthand(doc)
    for k in r:
        if k not in BESIDE_CONFIG:
            raise doc.error((k,), "not with router.config (its EndpointPickerConfig chooses the picker, "
                                  "the scorers, the thresholds and the flow control)")
    for k in r.get("flow_control", {}):
        if k != "interval":
            raise doc.error(("flow_control", k), "not with router.config (only interval may stand beside it)")
    sim = _from_config(doc, ("config",), base, block_size)
    sim.latency_ms = float(r.get("latency_ms", 0.0))
    sim.interval = float(r.get("flow_control", {}).get("interval", sim.interval))
    return sim


def resolved_router(r: dict | str, base: Path) -> dict | str:
    """The block with its config file's path made absolute (for a scenario written elsewhere)."""
    if isinstance(r, str):
        return _path(r, base)
    if isinstance(r, dict) and isinstance(r.get("config"), str):
        return {**r, "config": _path(r["config"], base)}
    return r


def _path(path: str, base: Path | None) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() or base is None else base / p)


def _from_config(doc: Document, key: tuple, base: Path | None, block_size: int | None) -> SimRouter:
    src = doc.at(*key)
    if isinstance(src.data, str):
        path = Path(_path(src.data, base))
        if not path.is_file():
            raise doc.error(key, f"no such router config file: {path}")
        cfg = load_router_config(path)
    else:
        cfg = load_router_config(src)
    if uses_index(cfg.weights) and block_size and cfg.block_size not in (None, block_size):
        raise doc.error(key, f"the precise prefix scorer's blockSize {cfg.block_size} is not the replicas' "
                             f"block_size {block_size}: it would match none of their blocks")
    band = GatewayQueue(cfg.bands).band_for(cfg.default_priority)
    return SimRouter(cfg, shares=[1.0 if b.priority == band.priority else 0.0 for b in cfg.bands])


def _shorthand(doc: Document) -> SimRouter:
    o = {**ROUTER_DEFAULTS, "weights": {}, "latency_ms": 0.0, **doc.data}
    weights = o["weights"] or (WEIGHTED_DEFAULT if o["policy"] == "weighted" else {})
    cfg = RouterConfig(policy=o["policy"], weights={k: float(v) for k, v in weights.items()},
                       lru_blocks=int(o["prefix_lru_blocks"]), kv_threshold=float(o["kv_threshold"]),
                       queue_threshold=int(o["queue_threshold"]), ties="turn", source=doc.name or "scenario")
    sim = SimRouter(cfg, latency_ms=float(o["latency_ms"]))
    if "flow_control" in o:
        _flow_control(doc, o["flow_control"], sim)
    return sim


def _flow_control(doc: Document, f: dict, sim: SimRouter) -> None:
    """The gateway queue's settings, defaults filled (routing.flow)."""
    given = f.get("bands", [{"priority": 0}])
    bands = [Band(int(b["priority"]), int(b.get("capacity", Band.capacity)), float(b.get("ttl", Band.ttl)),
                  str(b.get("name", "")), float(b.get("saturation", Band.saturation))) for b in given]
    if len({b.priority for b in bands}) != len(bands):
        raise doc.error(("flow_control", "bands"), "priorities must be distinct")
    cfg = sim.config
    cfg.flow_control, cfg.bands = True, bands
    cfg.gate_thresholds = (int(f.get("queue_threshold", SaturationDetector.queue_threshold)),
                           float(f.get("kv_threshold", SaturationDetector.kv_threshold)))
    sim.shares = [float(b.get("share", 1.0 / len(bands))) for b in given]
    sim.interval = float(f.get("interval", sim.interval))  # seconds between dispatch rounds
