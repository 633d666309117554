"""One router config for simulation and live: a scenario's `router:` takes the EndpointPickerConfig that
`slopilot route` reads (its path, or the mapping inline), parsed by routing.config into the same
RouterConfig; both build their Router with routing.config.build_router, so on the same endpoints and
state they pick the same. The scenario's shorthand (policy, weights, ...) becomes a RouterConfig too."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from autoscaler.validation import problems
from controlplane.router.app import build_router_app
from routing.config import RouterConfig, build_router, load_router_config
from routing.flow import SaturationDetector
from simulator.fleet import Fleet
from simulator.run import build_workload
from simulator.scenario import load_scenario
from simulator.scenario_router import ROUTER, resolved_router, router_config
from simulator.scenario_schema import SCENARIO

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HEAD = """\
name: t
seed: 4
duration: 30
workload: {arrivals: {rate: 2}, prompt_tokens: 300, output_tokens: 20}
pools:
  - {name: p, latency_model: h100-llama2-70b-tp4, replicas: 3}
"""


def scenario(tmp_path: Path, router: str, name: str = "s.yaml") -> Path:
    (tmp_path / "router.yaml").write_text((EXAMPLES / "router.yaml").read_text())
    (tmp_path / "router_flow.yaml").write_text((EXAMPLES / "router_flow.yaml").read_text())
    (tmp_path / name).write_text(HEAD + router)
    return tmp_path / name


def live_gate(cfg: RouterConfig):
    """The live router's gate (its Router, queue and detector), as `slopilot route` builds it."""
    return build_router_app(cfg, lambda: []).st.gate


class View:
    def __init__(self, id, outstanding, num_waiting, num_running, kv_usage):
        self.id, self.outstanding, self.num_waiting = id, outstanding, num_waiting
        self.num_running, self.kv_usage = num_running, kv_usage


def test_the_example_scenario_reads_the_live_routers_file():
    sc = load_scenario(EXAMPLES / "router_epp.yaml")
    live = load_router_config(EXAMPLES.resolve() / "router.yaml")
    assert sc.router.config == live  # every field: plugins, weights, thresholds, blocks, bands
    assert (live.policy, live.weights) == ("weighted", {"queue": 1.0, "kv": 1.0, "prefix": 2.0})
    assert sc.router.latency_ms == 0.0


@pytest.mark.parametrize("file", ["router.yaml", "router_flow.yaml"])
def test_same_plugins_and_the_same_picks(tmp_path, file):
    sc = load_scenario(scenario(tmp_path, f"router: {file}\n"))
    cfg = load_router_config(tmp_path / file)
    gate = live_gate(cfg)
    sim = Fleet(sc, build_workload(sc, sc.seed))
    live_r, sim_r = gate.router, sim.router
    for attr in ("policy", "weights", "kv_threshold", "queue_threshold", "ties", "block_tokens",
                 "uses_prefix", "load_slack", "load_margin"):
        assert getattr(live_r, attr) == getattr(sim_r, attr), attr
    capacity = [r.index.capacity if r.index else None for r in (live_r, sim_r)]
    assert capacity[0] == capacity[1]
    if cfg.flow_control:  # the gateway: the same bands (in priority order) and saturation detector
        assert sim.gate.queue.bands == gate.queue.bands and sim.gate.detector == gate.detector
    else:
        assert sim.gate is None
    # the same random stream for both (the simulator seeds its own from the scenario's seed)
    live_r.rng, sim_r.rng = np.random.default_rng(7), np.random.default_rng(7)
    rnd = random.Random(3)
    prefixes = [[rnd.randrange(50_000) for _ in range(64)] for _ in range(4)]  # shared system prompts
    picks = []
    for _ in range(400):
        views = [View(i, rnd.randrange(6), rnd.choice([0, 0, 1, 3, 7]), rnd.randrange(8),
                      rnd.choice([0.1, 0.5, 0.85, 0.97])) for i in rnd.sample(range(6), rnd.randint(1, 6))]
        tokens = rnd.choice(prefixes) + [rnd.randrange(50_000) for _ in range(rnd.randrange(40))]
        a, b = live_r.pick(views, tokens), sim_r.pick(views, tokens)
        assert a == b
        picks.append(views[a].id)
    assert len(set(picks)) == 6  # not one endpoint whatever the state


def test_file_inline_and_config_forms_give_one_config(tmp_path):
    inline = yaml.safe_load((EXAMPLES / "router_flow.yaml").read_text())
    by_path = load_scenario(scenario(tmp_path, "router: router_flow.yaml\n")).router
    by_map = load_scenario(scenario(tmp_path, "router: " + yaml.safe_dump(inline, default_flow_style=True),
                                    "inline.yaml")).router
    wrapped = load_scenario(scenario(tmp_path, "router: {config: router_flow.yaml, latency_ms: 2, "
                                     "flow_control: {interval: 0.05}}\n", "wrapped.yaml")).router
    assert by_map.config.source.endswith("inline.yaml")
    by_map.config.source = by_path.config.source
    assert by_path.config == by_map.config == wrapped.config
    assert (wrapped.latency_ms, wrapped.interval) == (2.0, 0.05)
    assert (by_path.latency_ms, by_path.interval) == (0.0, 0.01)
    # every simulated request carries the defaultPriority (0: the `low` band), as a live request
    # without a priority header or objective
    assert [b.name for b in by_path.config.bands] == ["high", "low"] and by_path.shares == [0.0, 1.0]


def test_the_shorthand_becomes_a_router_config():
    sim = router_config({"policy": "weighted", "weights": {"queue": 1, "prefix": 3}, "latency_ms": 4,
                         "flow_control": {"queue_threshold": 9, "bands": [{"priority": 1, "share": 0.3},
                                                                          {"priority": 0, "share": 0.7}]}})
    cfg = sim.config
    assert isinstance(cfg, RouterConfig)
    assert (cfg.policy, cfg.weights, cfg.ties, cfg.lru_blocks) == ("weighted", {"queue": 1.0, "prefix": 3.0},
                                                                   "turn", 100_000)
    assert (cfg.kv_threshold, cfg.queue_threshold, cfg.prefix_block()) == (0.95, 64, 64)
    assert cfg.flow_control and cfg.detector() == SaturationDetector(9, SaturationDetector.kv_threshold)
    assert (sim.latency_ms, sim.shares, [b.priority for b in cfg.bands]) == (4.0, [0.3, 0.7], [1, 0])
    r = build_router(cfg, seed=5)
    assert (r.policy, r.ties, r.block_tokens, r.kv_threshold, r.queue_threshold) == \
        ("weighted", "turn", 64, 0.95, 64)
    default = router_config(None).config  # no router block: the simulator's own defaults
    assert (default.policy, default.weights, default.flow_control) == ("least_outstanding", {}, False)


def test_the_schema_takes_both_forms():
    for ok in ({"policy": "weighted", "weights": {"kv": 1}}, "router.yaml", {"config": "router.yaml"},
               {"config": {"kind": "EndpointPickerConfig"}, "latency_ms": 1},
               {"kind": "EndpointPickerConfig", "plugins": [{"type": "queue-scorer"}]}, {}):
        assert problems(ROUTER, ok) == [], ok
    assert problems(ROUTER, {"policy": "weighted", "plugins": []}) == []  # an EPP field: routing.config's
    assert problems(ROUTER, {"policy": "nope"})[0][0] == ("policy",)
    assert problems(ROUTER, 5) == [((), "must be a mapping (policy, weights, ...), an EndpointPickerConfig "
                                        "or its file's path, got 5")]
    assert problems(ROUTER, "") == [((), "must not be empty")]
    assert SCENARIO["properties"]["router"] is ROUTER


@pytest.mark.parametrize("router,error", [
    # inline: the scenario's file, line and the full field path
    ("router:\n  kind: EndpointPickerConfig\n  plugins: [{type: queue-scorr}]\n",
     r"s\.yaml:9: router\.plugins\[0\]\.type: must be one of queue-scorer, "),
    ("router:\n  kind: EndpointPickerConfig\n  plugins: [{type: queue-scorer}]\n"
     "  schedulingProfiles: [{name: d, plugins: [{pluginRef: nope}]}]\n",
     r"s\.yaml:10: router\.schedulingProfiles\[0\]\.plugins\[0\]\.pluginRef: no plugin named 'nope'"),
    ("router: {config: {kind: EndpointPickerConfig, dataLayer: {refreshInterval: soon}}}\n",
     r"s\.yaml:7: router\.config\.dataLayer\.refreshInterval: not a duration: 'soon'"),
    ("router: absent.yaml\n", r"s\.yaml:7: router: no such router config file: .*absent\.yaml"),
    ("router: {config: router.yaml, policy: weighted}\n",
     r"s\.yaml:7: router\.policy: not with router\.config"),
    ("router: {config: router.yaml, flow_control: {bands: [{priority: 1}]}}\n",
     r"s\.yaml:7: router\.flow_control\.bands: not with router\.config"),
    ("router: 7\n", r"s\.yaml:7: router: must be a mapping \(policy, weights, \.\.\.\)"),
    ("router: {flow_control: {bands: [{priority: 1}, {priority: 1}]}}\n",
     r"s\.yaml:7: router\.flow_control\.bands: priorities must be distinct"),
    ("router:\n  kind: EndpointPickerConfig\n  plugins:\n  - type: precise-prefix-cache-scorer\n"
     "    parameters: {blockSize: 32}\n", r"s\.yaml:7: router: the precise prefix scorer's blockSize 32 is "
                                          r"not the replicas' block_size 16"),
])
def test_a_bad_router_block_names_file_line_and_field(tmp_path, router, error):
    with pytest.raises(ValueError, match=error):
        load_scenario(scenario(tmp_path, router))


def test_a_bad_config_file_names_its_own_file_and_line(tmp_path):
    path = scenario(tmp_path, "router: bad.yaml\n")
    (tmp_path / "bad.yaml").write_text("kind: EndpointPickerConfig\nplugins:\n- type: max-score-picker\n"
                                       "  parameters: {seed: -1}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml:4: plugins\[0\]\.parameters\.seed: must be an integer"):
        load_scenario(path)


def test_a_plan_or_sizing_run_keeps_the_files_folder(tmp_path):
    assert resolved_router("router.yaml", tmp_path) == str(tmp_path / "router.yaml")
    assert resolved_router({"config": "r.yaml", "latency_ms": 1}, tmp_path) == \
        {"config": str(tmp_path / "r.yaml"), "latency_ms": 1}
    assert resolved_router({"policy": "weighted"}, tmp_path) == {"policy": "weighted"}
