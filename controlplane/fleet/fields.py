"""FLEET.yaml's parsed form (FleetConfig, a P/D fleet's PDFleet) and the parts read alike at the top
level and in a P/D pool (controlplane.fleet.pd): engine flags, replica bounds, the autoscaler spec and
the router config, each error at its file, line and field. controlplane.fleet.config reads the file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.spec import Spec, load_spec
from autoscaler.yamlfile import Document, parse
from controlplane.loadgen import LoadSpec
from controlplane.specs import read_text
from routing.config import RouterConfig, load_router_config
from simulator.scenario_limits import MAX_REPLICAS
from simulator.scenario_schema import resolve

RESERVED = {"host", "port", "emulate", "model", "drain_timeout"}  # serve flags the fleet sets itself


@dataclass
class FleetConfig:
    name: str
    emulate: str | None  # latency-model name or path (emulated replicas); exactly one of emulate/model
    model: str | None  # preset name or model directory (real replicas)
    engine: dict[str, str | int | float | bool] = field(default_factory=dict)
    replicas: int = 1
    min_replicas: int = 0
    max_replicas: int = 1
    drain_timeout: float = 30.0
    start_timeout: float = 60.0
    scrape_interval: float = 5.0
    autoscaler: Spec | None = None  # the validated ScaledObject / InferenceAutoscaler
    autoscaler_path: str | None = None  # its file, when it was given as one
    load: LoadSpec | None = None
    router: RouterConfig | None = None  # the router in front of the fleet, when asked for
    batch_engine_priority: int | None = None  # the router's Batch API lines sent at this `priority`
    source: str = "FLEET"  # the file it came from, for messages
    pd: PDFleet | None = None  # a P/D fleet's two pools (then replicas etc. are the pools' sums)

    def serve_args(self, port: int, host: str = "127.0.0.1") -> list[str]:
        """The `slopilot serve` arguments of one replica on `port`."""
        args = ["--emulate", self.emulate] if self.emulate else ["--model", self.model]
        args += ["--host", host, "--port", str(port), "--drain-timeout", _fmt(self.drain_timeout)]
        for key, value in self.engine.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, _fmt(value)]
        return args


def _fmt(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


@dataclass
class PDFleet:
    threshold: int
    prefill: FleetConfig
    decode: FleetConfig

    def pools(self) -> dict[str, FleetConfig]:
        return {"prefill": self.prefill, "decode": self.decode}


def read(path: Path) -> Document:
    return parse(read_text(path), str(path))  # size-checked before it is read


def check_engine_keys(doc: Document, where: tuple, engine_flags: set[str] | None, reserved: set[str]) -> None:
    """Each key of the engine mapping at `where` must be a serve flag the fleet does not set itself."""
    node = doc.data
    for part in where:
        node = node.get(part, {})
    for key in node:
        if key.replace("-", "_") in reserved:
            raise doc.error((*where, key), "is set by the fleet (see its top-level fields)")
        if engine_flags is not None and key.replace("-", "_") not in engine_flags:
            close = difflib.get_close_matches(key.replace("-", "_"), sorted(engine_flags), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            allowed = ", ".join(sorted(engine_flags - reserved))
            raise doc.error((*where, key), f"is not a `slopilot serve` flag{hint}; allowed: {allowed}")

def sizing(doc: Document, where: tuple, spec: Spec | None) -> tuple[int, int, int]:
    """(replicas, min_replicas, max_replicas) of the mapping at `where`, defaults from its autoscaler."""
    d = doc.data
    for part in where:
        d = d[part]
    min_r = int(d.get("min_replicas", spec.min_replicas if spec else 0))
    max_r = int(d.get("max_replicas", spec.max_replicas if spec else max(min_r, d.get("replicas", 1))))
    if min_r > max_r:
        raise doc.error((*where, "min_replicas"), f"must be <= max_replicas ({max_r}), got {min_r}")
    replicas = int(d.get("replicas", max(min_r, 1)))
    for key, value in (("replicas", replicas), ("max_replicas", max_r)):
        if value > MAX_REPLICAS:  # the scenarios' limit: one machine's fleet is far below it anyway
            raise doc.error((*where, key), f"must be <= {MAX_REPLICAS}, got {value}")
    if not min_r <= replicas <= max_r:
        bounds = f"[min_replicas, max_replicas] = [{min_r}, {max_r}]"
        raise doc.error((*where, "replicas"), f"must be within {bounds}, got {replicas}")
    return replicas, min_r, max_r

def router_of(doc: Document, base: Path) -> RouterConfig | None:
    value = doc.data.get("router", False)
    if value is False:
        return None
    if value is True:
        return load_router_config(None)
    if isinstance(value, dict):
        return load_router_config(doc.at("router"))
    path = Path(resolve(value, base))
    if not path.is_file():
        raise doc.error(("router",), f"no such router config file: {path}")
    return load_router_config(path)

def autoscaler_of(doc: Document, base: Path, where: tuple = ()) -> tuple[Spec | None, str | None]:
    node = doc.data
    for part in where:
        node = node[part]
    value = node.get("autoscaler")
    if value is None:
        return None, None
    if isinstance(value, dict):
        return load_spec(doc.at(*where, "autoscaler")), None
    path = Path(resolve(value, base))
    if not path.is_file():
        raise doc.error((*where, "autoscaler"), f"no such spec file: {path}")
    return load_spec(read(path), path=str(path)), str(path)
