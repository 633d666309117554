"""A scenario's `router` block, defaults filled: the policy, its weights and thresholds, the network
latency to a replica, and the gateway queue (flow_control, routing.flow)."""

from __future__ import annotations

import inspect

from routing.flow import Band, SaturationDetector
from routing.router import Router

ROUTER_DEFAULTS = {
    k: inspect.signature(Router).parameters[k].default
    for k in ("policy", "prefix_lru_blocks", "kv_threshold", "queue_threshold")
}
WEIGHTED_DEFAULT = {"prefix": 2.0, "kv": 1.0, "queue": 1.0}  # the weighted policy without weights


def router_config(r: dict) -> dict:
    """The `router` block as the fleet reads it."""
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
