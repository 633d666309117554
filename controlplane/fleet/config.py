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
    autoscaler: keda_queue.yaml        # a one-document spec file (ScaledObject or InferenceAutoscaler)
                                       # or the spec inline
    router: true                       # optional: the router in front of the replicas (or a ROUTER.yaml
                                       # path, or an inline EndpointPickerConfig); the load goes through it
    load:                              # see controlplane.loadgen.LoadSpec.parse
      arrivals: {piecewise: [[0, 1], [60, 8], [120, 1]]}
      output_tokens: 64

Parsed by the one YAML loader and checked against controlplane.fleet.schema: every error names the
file, line and field (`fleet.yaml:7: max_replicas: must be >= 1, got 0`). Relative paths are read from
the FLEET.yaml's folder.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.spec import Spec, load_spec
from autoscaler.validation import check
from autoscaler.yamlfile import Document, document, parse
from controlplane.fleet.schema import FLEET
from controlplane.loadgen import LoadSpec
from controlplane.router.config import RouterConfig, load_router_config
from controlplane.specs import read_text
from simulator.latency import load_latency_model
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


def _read(path: Path) -> Document:
    return parse(read_text(path), str(path))  # size-checked before it is read


def load_fleet_config(source: str | Path | dict | Document, base_dir: Path | None = None,
                      engine_flags: set[str] | None = None, check_model: bool = False) -> FleetConfig:
    """A FleetConfig from a FLEET.yaml path, a mapping or a parsed Document; ValueError names file,
    line and field; FileNotFoundError for a missing file. engine_flags: the `slopilot serve` flags
    (underscored, no dashes) an `engine` key may name; None: not checked. check_model: load `emulate`'s
    latency model now, so a wrong name is an error at its line (with the shipped models) rather than a
    replica that fails to start."""
    name = "fleet"
    if isinstance(source, (dict, Document)):
        doc = document(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"fleet file not found: {path}")
        doc, name, base_dir = _read(path), path.stem, base_dir or path.resolve().parent
    base = base_dir or Path(".")
    if not isinstance(doc.data, dict):
        raise doc.error((), "a fleet file must be a mapping (name, emulate or model, replicas, ...)")
    check(FLEET, doc)
    d = doc.data
    for key in d.get("engine", {}):
        if key.replace("-", "_") in RESERVED:
            raise doc.error(("engine", key), "is set by the fleet (see its top-level fields)")
        if engine_flags is not None and key.replace("-", "_") not in engine_flags:
            close = difflib.get_close_matches(key.replace("-", "_"), sorted(engine_flags), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            allowed = ", ".join(sorted(engine_flags - RESERVED))
            raise doc.error(("engine", key), f"is not a `slopilot serve` flag{hint}; allowed: {allowed}")

    emulate, model = d.get("emulate"), d.get("model")
    if emulate and ("/" in emulate or emulate.endswith(".json")):
        emulate = resolve(emulate, base)
    if emulate and check_model:
        try:
            load_latency_model(emulate)
        except (ValueError, OSError) as exc:
            raise doc.error(("emulate",), str(exc)) from None
    if model and "/" in model:
        model = resolve(model, base)
    spec, spec_path = _autoscaler(doc, base)

    min_r = int(d.get("min_replicas", spec.min_replicas if spec else 0))
    max_r = int(d.get("max_replicas", spec.max_replicas if spec else max(min_r, d.get("replicas", 1))))
    if min_r > max_r:
        raise doc.error(("min_replicas",), f"must be <= max_replicas ({max_r}), got {min_r}")
    replicas = int(d.get("replicas", max(min_r, 1)))
    for key, value in (("replicas", replicas), ("max_replicas", max_r)):
        if value > MAX_REPLICAS:  # the scenarios' limit: one machine's fleet is far below it anyway
            raise doc.error((key,), f"must be <= {MAX_REPLICAS}, got {value}")
    if not min_r <= replicas <= max_r:
        bounds = f"[min_replicas, max_replicas] = [{min_r}, {max_r}]"
        raise doc.error(("replicas",), f"must be within {bounds}, got {replicas}")
    engine = dict(d.get("engine", {}))
    cfg = FleetConfig(name=d.get("name", name), emulate=emulate, model=model, engine=engine,
                      replicas=replicas, min_replicas=min_r, max_replicas=max_r, autoscaler=spec,
                      autoscaler_path=spec_path, source=doc.name or "FLEET")
    for key in ("drain_timeout", "start_timeout", "scrape_interval"):
        if key in d:
            setattr(cfg, key, float(d[key]))
    if "load" in d:
        cfg.load = LoadSpec.parse(doc.at("load"))
    cfg.router = _router(doc, base)
    return cfg


def _router(doc: Document, base: Path) -> RouterConfig | None:
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


def _autoscaler(doc: Document, base: Path) -> tuple[Spec | None, str | None]:
    value = doc.data.get("autoscaler")
    if value is None:
        return None, None
    if isinstance(value, dict):
        return load_spec(doc.at("autoscaler")), None
    path = Path(resolve(value, base))
    if not path.is_file():
        raise doc.error(("autoscaler",), f"no such spec file: {path}")
    return load_spec(_read(path), path=str(path)), str(path)
