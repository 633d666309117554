"""ROUTER.yaml: the router's plugins, weights and flow control, shaped like llm-d's EndpointPickerConfig.
The live router (`slopilot route`, a fleet file's `router`) and the simulator (a scenario's `router`:
this file's path, or the same mapping inline) read it here, into one RouterConfig, and build their
Router from it with build_router: the same file picks the same plugins, weights and endpoints.

    apiVersion: llm-d.ai/v1
    kind: EndpointPickerConfig
    plugins:
    - type: queue-scorer                       # waiting requests (min-max: fewest is 1)
    - type: kv-cache-utilization-scorer        # 1 - KV usage
    - type: prefix-cache-scorer                # share of the prompt's leading blocks routed there before
      parameters: {blockSize: 16, lruCapacityPerServer: 31250, tokenizer: byte}
    - type: max-score-picker                   # best weighted sum; ties at random (seeded)
      parameters: {seed: 0}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: queue-scorer, weight: 1}, {pluginRef: prefix-cache-scorer, weight: 2}, ...]
    saturationDetector: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8}
    flowControl:                               # the gateway queue (without it: one band, no saturation gate)
      defaultPriority: 0
      priorityBands: [{priority: 10, name: high, maxRequests: 100, ttl: 10s}, {priority: 0, ttl: 60s,
                      saturation: 0.5}]        # a band's requests go only to endpoints under this
                                               # fraction of the detector's thresholds (default 1)
      objectives: {premium: 10}                # x-gateway-inference-objective header (or model) -> priority
    dataLayer: {refreshInterval: 100ms, healthCheckInterval: 1s, ejectAfter: 1}
    timeouts:                                  # each proxied request's, per route if given (no byte of the
      firstByte: 60s                           # answer in firstByte: tried on another endpoint; the whole
      total: 10m                               # answer within total, else cut off)
      routes: {/v1/completions: {firstByte: 30s, total: 5m}}

Scorer plugin types and the simulator scorer they run: queue-scorer (queue), kv-cache-utilization-scorer
(kv), prefix-cache-scorer (prefix), active-request-scorer (load: requests in flight through this
router), precise-prefix-cache-scorer (precise_prefix: the blocks each endpoint holds, from its KV events;
zmqEndpoint, mediumWeights and the prefix scorer's parameters: routing.precise),
running-requests-scorer (running), session-affinity-scorer (session; the header is a
parameter). Pickers: max-score-picker (the weighted policy), round-robin-picker, random-picker,
least-outstanding-picker, prefix-affinity-picker (the simulator's bounded-load prefix policy). These
are the plugin types registered with the scorers and pickers (routing.scorers, routing.pickers);
one registered later is accepted here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.validation import check
from autoscaler.yamlfile import MAX_CHARS, Document, document, parse
from routing.config_schema import duration, picker_types, router_schema, scorer_types
from routing.flow import Band, SaturationDetector
from routing.precise import PLUGIN_TYPE as PRECISE_TYPE
from routing.precise import precise_params
from routing.router import TIES, Router


@dataclass
class RouterConfig:
    policy: str = "weighted"
    weights: dict[str, float] = field(default_factory=lambda: {"queue": 1.0, "kv": 1.0, "prefix": 2.0})
    seed: int = 0
    block_size: int | None = None  # prefix blocks: tokens with a tokenizer, else characters
    lru_blocks: int = 31_250  # prefix blocks remembered per endpoint
    tokenizer: str | None = None  # "byte" (the engine's byte tokenizer) or a tokenizer.json path
    bos_token_id: int = 256
    session_header: str = "x-session-id"
    flow_control: bool = False  # off: one band, and only an empty pool holds requests
    queue_threshold: int = 5
    kv_threshold: float = 0.8
    bands: list[Band] = field(default_factory=lambda: [Band(0, capacity=10_000, ttl=60.0)])
    default_priority: int = 0
    objectives: dict[str, int] = field(default_factory=dict)
    refresh_interval: float = 0.1
    health_interval: float = 1.0
    scrape_timeout: float = 1.0
    connect_timeout: float = 2.0
    eject_after: int = 1  # consecutive failures (refused, 503, failed scrape) before an endpoint is ejected
    max_retries: int = 2  # other endpoints tried before the first byte
    first_byte_timeout: float = 60.0  # no byte of an engine's stream by then: another endpoint
    total_timeout: float = 600.0  # the whole answer (a stream's last chunk) by then, else cut off
    route_timeouts: dict[str, tuple[float, float]] = field(default_factory=dict)  # path -> both
    source: str = "ROUTER"
    kv_events_endpoint: str | None = None  # the precise scorer's SUB socket (controlplane.router.precise)
    kv_medium_weights: dict[str, float] | None = None
    # not in the file (a scenario's shorthand router block sets them): how ties between equal scores
    # are broken (the max-score picker's: at random), and the gateway's saturation detector when it
    # has thresholds of its own (None: the saturationDetector's, which the filter also uses)
    ties: str = "random"
    gate_thresholds: tuple[int, float] | None = None

    def prefix_block(self) -> int:
        return self.block_size or (16 if self.tokenizer else 64)

    def timeouts(self, path: str) -> tuple[float, float]:
        """(first byte, total) seconds for a request on `path`."""
        return self.route_timeouts.get(path) or (self.first_byte_timeout, self.total_timeout)

    def detector(self) -> SaturationDetector:
        """The flow control's saturation detector."""
        return SaturationDetector(*(self.gate_thresholds or (self.queue_threshold, self.kv_threshold)))


def build_router(cfg: RouterConfig, seed: int | None = None, block_tokens: int | None = None) -> Router:
    """The Router a config describes: the live router's and the simulator's are built here alike.
    `seed` (default: the picker's) and `block_tokens` (default: the prefix scorer's blockSize)
    are the caller's when it has its own (a scenario's seed; the replicas' block size)."""
    if cfg.ties not in TIES:
        raise ValueError(f"ties must be one of {', '.join(TIES)}, got {cfg.ties!r}")
    return Router(cfg.policy, cfg.weights, cfg.seed if seed is None else seed, cfg.lru_blocks,
                  block_tokens or cfg.prefix_block(), kv_threshold=cfg.kv_threshold,
                  queue_threshold=cfg.queue_threshold, ties=cfg.ties)


def load_router_config(source: str | Path | dict | Document | None) -> RouterConfig:
    """A RouterConfig from a file path, a mapping or a Document (None: the defaults). ValueError
    names file, line and field; FileNotFoundError for a missing file."""
    if source is None:
        return RouterConfig()
    if isinstance(source, (dict, Document)):
        doc = document(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"router config not found: {path}")
        doc = parse(_read(path), str(path))
    if not isinstance(doc.data, dict):
        raise doc.error((), "a router config must be a mapping (kind: EndpointPickerConfig, plugins, ...)")
    check(router_schema(), doc)
    d = doc.data
    cfg = RouterConfig(source=doc.name or "ROUTER")
    plugins: dict[str, dict] = {}
    for i, p in enumerate(d.get("plugins", [])):
        name = p.get("name", p["type"])
        if name in plugins:
            raise doc.error(("plugins", i, "name"), f"duplicate plugin name {name!r}")
        plugins[name] = {**p, "at": i}
    profiles = d.get("schedulingProfiles")
    refs = profiles[0].get("plugins", []) if profiles else [{"pluginRef": n} for n in plugins]
    if plugins or profiles:
        cfg.weights, cfg.policy = {}, "weighted"
    pickers = []
    for j, ref in enumerate(refs):
        p = plugins.get(ref["pluginRef"])
        if p is None:
            raise doc.error(("schedulingProfiles", 0, "plugins", j, "pluginRef"),
                            f"no plugin named {ref['pluginRef']!r} in plugins")
        params, where = p.get("parameters", {}), ("plugins", p["at"], "parameters")
        if p["type"] in picker_types():
            pickers.append(p["type"])
            cfg.policy = picker_types()[p["type"]]
            cfg.seed = _int(doc, where, params, "seed", cfg.seed)
            continue
        cfg.weights[scorer_types()[p["type"]]] = float(ref.get("weight", 1))
        if p["type"] == "prefix-cache-scorer":
            _prefix_params(doc, where, params, cfg)
        elif p["type"] == PRECISE_TYPE:
            _prefix_params(doc, where, precise_params(doc, where, params, cfg), cfg)
        elif p["type"] == "session-affinity-scorer":
            cfg.session_header = str(params.get("header", cfg.session_header)).lower()
    if len(pickers) > 1:
        raise doc.error(("schedulingProfiles", 0, "plugins"), f"one picker at most, got {', '.join(pickers)}")
    if cfg.policy == "prefix_affinity":  # its prefix index is on without a scorer weight
        prefix = next((p for p in plugins.values() if p["type"] == "prefix-cache-scorer"), None)
        if prefix is not None:
            _prefix_params(doc, ("plugins", prefix["at"], "parameters"), prefix.get("parameters", {}), cfg)
    sat = d.get("saturationDetector", {})
    cfg.queue_threshold = int(sat.get("queueDepthThreshold", cfg.queue_threshold))
    cfg.kv_threshold = float(sat.get("kvCacheUtilThreshold", cfg.kv_threshold))
    if "flowControl" in d:
        _flow_control(doc, cfg)
    for key, attr in (("refreshInterval", "refresh_interval"), ("healthCheckInterval", "health_interval"),
                      ("scrapeTimeout", "scrape_timeout"), ("connectTimeout", "connect_timeout")):
        if key in d.get("dataLayer", {}):
            setattr(cfg, attr, duration(doc, ("dataLayer", key), d["dataLayer"][key]))
    for key, attr in (("ejectAfter", "eject_after"), ("maxRetries", "max_retries")):
        if key in d.get("dataLayer", {}):
            setattr(cfg, attr, int(d["dataLayer"][key]))
    if "timeouts" in d:
        _timeouts(doc, cfg)
    return cfg


def _read(path: Path) -> str:
    size = path.stat().st_size  # a huge file is refused before it is read
    if size > MAX_CHARS:
        raise ValueError(f"{path}: {size} bytes, more than the limit of {MAX_CHARS} for an input file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None


def _timeouts(doc: Document, cfg: RouterConfig) -> None:
    t = doc.data["timeouts"]
    if "firstByte" in t:
        cfg.first_byte_timeout = duration(doc, ("timeouts", "firstByte"), t["firstByte"])
    if "total" in t:
        cfg.total_timeout = duration(doc, ("timeouts", "total"), t["total"])
    for route, r in t.get("routes", {}).items():
        where = ("timeouts", "routes", route)
        first = duration(doc, (*where, "firstByte"), r["firstByte"]) if "firstByte" in r \
            else cfg.first_byte_timeout
        total = duration(doc, (*where, "total"), r["total"]) if "total" in r else cfg.total_timeout
        cfg.route_timeouts[str(route)] = (first, total)


def _int(doc: Document, where: tuple, params: dict, key: str, default: int) -> int:
    value = params.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise doc.error((*where, key), f"must be an integer >= 0, got {value!r}")
    return value


def _prefix_params(doc: Document, where: tuple, params: dict, cfg: RouterConfig) -> None:
    unknown = set(params) - {"blockSize", "lruCapacityPerServer", "tokenizer", "bosTokenId"}
    if unknown:
        raise doc.error((*where, sorted(unknown)[0]), "unknown parameter (blockSize, lruCapacityPerServer, "
                                                      "tokenizer, bosTokenId)")
    if "blockSize" in params:
        cfg.block_size = _int(doc, where, params, "blockSize", 0) or None
    cfg.lru_blocks = _int(doc, where, params, "lruCapacityPerServer", cfg.lru_blocks)
    cfg.bos_token_id = _int(doc, where, params, "bosTokenId", cfg.bos_token_id)
    tok = params.get("tokenizer")
    if tok is not None:
        if not isinstance(tok, str):
            raise doc.error((*where, "tokenizer"), "must be 'byte' or a tokenizer.json path")
        if tok != "byte":
            path = Path(tok) if Path(tok).is_absolute() or not doc.name else Path(doc.name).parent / tok
            if not path.is_file():
                raise doc.error((*where, "tokenizer"), f"no such tokenizer file: {path}")
            tok = str(path)
        cfg.tokenizer = tok


def _flow_control(doc: Document, cfg: RouterConfig) -> None:
    f = doc.data["flowControl"]
    cfg.flow_control = True
    ttl = duration(doc, ("flowControl", "defaultRequestTTL"), f["defaultRequestTTL"]) \
        if "defaultRequestTTL" in f else 60.0
    bands = []
    for i, b in enumerate(f.get("priorityBands", [{"priority": 0}])):
        band_ttl = duration(doc, ("flowControl", "priorityBands", i, "ttl"), b["ttl"]) if "ttl" in b else ttl
        bands.append(Band(int(b["priority"]), int(b.get("maxRequests", 1000)), band_ttl, b.get("name", ""),
                          float(b.get("saturation", 1.0))))
    if len({b.priority for b in bands}) != len(bands):
        raise doc.error(("flowControl", "priorityBands"), "priorities must be distinct")
    cfg.bands = bands
    cfg.default_priority = int(f.get("defaultPriority", 0))
    cfg.objectives = {str(k): int(v) for k, v in f.get("objectives", {}).items()}
