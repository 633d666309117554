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
    batch_engine_priority: 1           # optional: the router's Batch API lines carry this `priority`
    load:                              # see controlplane.loadgen.LoadSpec.parse
      arrivals: {piecewise: [[0, 1], [60, 8], [120, 1]]}
      output_tokens: 64

A P/D fleet (a prefill pool and a decode pool, the router in P/D mode in front) has a `pd:` block in
place of replicas/min_replicas/max_replicas/autoscaler: see controlplane.fleet.pd.

Parsed by the one YAML loader and checked against controlplane.fleet.schema: every error names the
file, line and field (`fleet.yaml:7: max_replicas: must be >= 1, got 0`). Relative paths are read from
the FLEET.yaml's folder.
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.validation import check
from autoscaler.yamlfile import Document, document
from controlplane.fleet.fields import (  # noqa: F401 - FleetConfig, PDFleet: imported from here too
    RESERVED,
    FleetConfig,
    PDFleet,
    autoscaler_of,
    check_engine_keys,
    read,
    router_of,
    sizing,
)
from controlplane.fleet.pd import PD_RESERVED, with_pd_pools
from controlplane.fleet.schema import FLEET
from controlplane.loadgen import LoadSpec
from simulator.latency import load_latency_model
from simulator.scenario_schema import resolve


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
        doc, name, base_dir = read(path), path.stem, base_dir or path.resolve().parent
    base = base_dir or Path(".")
    if not isinstance(doc.data, dict):
        raise doc.error((), "a fleet file must be a mapping (name, emulate or model, replicas, ...)")
    check(FLEET, doc)
    d = doc.data
    check_engine_keys(doc, ("engine",), engine_flags, RESERVED | (PD_RESERVED if "pd" in d else set()))

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
    engine = dict(d.get("engine", {}))
    cfg = FleetConfig(name=d.get("name", name), emulate=emulate, model=model, engine=engine,
                      source=doc.name or "FLEET")
    if "pd" in d:  # two pools, each with its own bounds and autoscaler
        return with_pd_pools(finish(cfg, doc, base), doc, base, engine_flags)
    cfg.autoscaler, cfg.autoscaler_path = autoscaler_of(doc, base)
    cfg.replicas, cfg.min_replicas, cfg.max_replicas = sizing(doc, (), cfg.autoscaler)
    return finish(cfg, doc, base)


def finish(cfg: FleetConfig, doc: Document, base: Path) -> FleetConfig:
    """The top-level fields every fleet shares: timeouts, load, router."""
    d = doc.data
    for key in ("drain_timeout", "start_timeout", "scrape_interval"):
        if key in d:
            setattr(cfg, key, float(d[key]))
    if "load" in d:
        cfg.load = LoadSpec.parse(doc.at("load"))
    cfg.router = router_of(doc, base)
    if "batch_engine_priority" in d:
        cfg.batch_engine_priority = int(d["batch_engine_priority"])
    if cfg.router is None and "pd" not in d:  # a P/D fleet runs its router anyway
        if "batch_engine_priority" in d:
            raise doc.error(("batch_engine_priority",), "the router's batch lines need the fleet's router "
                            "(router: true)")
        if cfg.load is not None and cfg.load.batch is not None:
            raise doc.error(("load", "batch"), "a load with a batch needs the fleet's router (router: true)")
    return cfg
