"""FLEET.yaml: a local fleet of engine replicas, its autoscaler and optional built-in load.

    name: llama-local                  # default: the file's stem
    emulate: h100-llama2-70b-tp4       # a shipped latency model or a JSON path; or `model:` (real weights)
    engine: {max_num_seqs: 64}         # extra `slopilot serve` flags (key -> --key; true -> bare flag)
    replicas: 1                        # at start; default max(min_replicas, 1)
    min_replicas: 1                    # the fleet's hard bounds; default the autoscaler's own
    max_replicas: 4
    drain_timeout: 30                  # seconds a replica may finish in-flight work after SIGTERM
    start_timeout: 60                  # seconds a new replica may take to answer /health with 200
    scrape_interval: 5                 # seconds between metric scrapes (Prometheus and direct)
    autoscaler: keda_queue.yaml        # a file (ScaledObject or InferenceAutoscaler) or the spec inline
    load: {piecewise: [[0, 1], [60, 8], [120, 1]], output_tokens: 64}   # see controlplane.loadgen

Relative paths are read from the FLEET.yaml's folder. Every error names the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autoscaler.spec import Spec, load_spec
from controlplane.loadgen import LoadSpec

KEYS = {"name", "emulate", "model", "engine", "replicas", "min_replicas", "max_replicas", "drain_timeout",
        "start_timeout", "scrape_interval", "autoscaler", "load"}
RESERVED = {"host", "port", "emulate", "model", "drain_timeout"}  # engine flags the fleet sets itself
POLICY_KINDS = ("ScaledObject", "InferenceAutoscaler")


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
    autoscaler_docs: list[dict] = field(default_factory=list)  # every document of its file, as read
    load: LoadSpec | None = None
    source: str = "FLEET"  # the file it came from, for messages

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


class _Checker:
    """Field checks whose errors read `FILE: FIELD: message`."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str):
        raise ValueError(f"{self.source}: {where}: {msg}")

    def number(self, d: dict, key: str, default, *, integer: bool = False, positive: bool = False):
        if key not in d:
            return default
        v = d[key]
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or (integer and v != int(v)):
            self.fail(key, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
        if v < 0 or (positive and v == 0):
            self.fail(key, f"must be {'> 0' if positive else '>= 0'}, got {v}")
        return int(v) if integer else float(v)

    def string(self, d: dict, key: str) -> str | None:
        v = d.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            self.fail(key, f"must be a non-empty string, got {v!r}")
        return v


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def load_fleet_config(source: str | Path | dict, base_dir: Path | None = None) -> FleetConfig:
    """A FleetConfig from a FLEET.yaml path or an already-parsed mapping; ValueError names file and field."""
    if isinstance(source, dict):
        doc, name, where = source, "fleet", "FLEET"
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"fleet file not found: {path}")
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        name, where, base_dir = path.stem, str(path), base_dir or path.resolve().parent
    base = base_dir or Path(".")
    c = _Checker(where)
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: must be a mapping of fleet settings")
    for k in doc:
        if k not in KEYS:
            c.fail(str(k), f"unknown key (allowed: {', '.join(sorted(KEYS))})")

    emulate, model = c.string(doc, "emulate"), c.string(doc, "model")
    if (emulate is None) == (model is None):
        c.fail("emulate", "give exactly one of emulate (a latency model) or model (real weights)")
    if emulate and ("/" in emulate or emulate.endswith(".json")):
        emulate = _resolve(emulate, base)
    if model and "/" in model:
        model = _resolve(model, base)

    engine = doc.get("engine") or {}
    if not isinstance(engine, dict):
        c.fail("engine", "must be a mapping of `slopilot serve` flags")
    for k, v in engine.items():
        if not isinstance(k, str) or not k.replace("_", "").replace("-", "").isalnum():
            c.fail(f"engine.{k}", "must be a flag name such as max_num_seqs")
        if k.replace("-", "_") in RESERVED:
            c.fail(f"engine.{k}", "is set by the fleet (use the top-level field where there is one)")
        if not isinstance(v, (str, int, float, bool)):
            c.fail(f"engine.{k}", f"must be a number, a string or true/false, got {v!r}")

    spec, docs = _autoscaler(doc.get("autoscaler"), c, base)
    lo_default = spec.min_replicas if spec else 0
    min_r = c.number(doc, "min_replicas", lo_default, integer=True)
    replicas = c.number(doc, "replicas", None, integer=True)
    max_default = spec.max_replicas if spec else max(min_r, replicas or 1)
    max_r = c.number(doc, "max_replicas", max_default, integer=True, positive=True)
    if min_r > max_r:
        c.fail("min_replicas", f"must be <= max_replicas ({max_r}), got {min_r}")
    replicas = max(min_r, 1) if replicas is None else replicas
    if not min_r <= replicas <= max_r:
        c.fail("replicas", f"must be within [min_replicas, max_replicas] = [{min_r}, {max_r}], "
                           f"got {replicas}")

    load = None
    if doc.get("load") is not None:
        try:
            load = LoadSpec.parse(doc["load"], "load")
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    cfg = FleetConfig(
        name=c.string(doc, "name") or name, emulate=emulate, model=model, engine=dict(engine),
        replicas=replicas, min_replicas=min_r, max_replicas=max_r, autoscaler=spec, autoscaler_docs=docs,
        load=load, source=where)
    cfg.drain_timeout = c.number(doc, "drain_timeout", cfg.drain_timeout)
    cfg.start_timeout = c.number(doc, "start_timeout", cfg.start_timeout, positive=True)
    cfg.scrape_interval = c.number(doc, "scrape_interval", cfg.scrape_interval, positive=True)
    return cfg


def _autoscaler(value, c: _Checker, base: Path) -> tuple[Spec | None, list[dict]]:
    """The one ScaledObject/InferenceAutoscaler of a file (other kinds kept, for the controller) or inline."""
    if value is None:
        return None, []
    if isinstance(value, dict):
        docs, where = [value], "autoscaler"
    elif isinstance(value, str):
        path = Path(_resolve(value, base))
        if not path.is_file():
            c.fail("autoscaler", f"no such spec file: {path}")
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as exc:
            c.fail("autoscaler", f"{path}: not valid YAML: {exc}")
        where = f"autoscaler ({path})"
    else:
        c.fail("autoscaler", "must be a spec file path or an inline ScaledObject/InferenceAutoscaler")
    policies = [d for d in docs if isinstance(d, dict) and d.get("kind") in POLICY_KINDS]
    if len(policies) != 1:
        c.fail(where, f"must hold exactly one of {', '.join(POLICY_KINDS)} (found {len(policies)})")
    try:
        return load_spec(policies[0]), docs
    except ValueError as exc:
        c.fail(where, str(exc))
