"""Scenario files: what to simulate, validated strictly.

    sc = load_scenario("examples/x.yaml")      # a path, YAML text, or a dict built in code

The file is parsed by the one safe YAML loader and checked against simulator.scenario_schema; every
error names the file, line and field (`examples/x.yaml:14: pools[0].max_num_seqs: must be >= 1, got 0`).
Relative paths (latency models, traces, autoscaler specs) resolve against the scenario file's folder,
and autoscaler specs are validated here too, so a bad spec is reported before the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.slo import SloTarget
from autoscaler.validation import check, problems
from autoscaler.yamlfile import Document, document, parse
from promql.rules import RuleGroup
from simulator.pd_spec import PDSpec, pd_config
from simulator.scenario_autoscaler import recording_rules
from simulator.scenario_limits import MAX_DURATION, check_limits
from simulator.scenario_pool import FailureSpec, PoolSpec, given, pool_spec
from simulator.scenario_router import ROUTER_DEFAULTS, SimRouter, router_config
from simulator.scenario_schema import ROUTERS, SCENARIO, SLO_NAMES
from simulator.scenario_workload import workload_config

__all__ = ["ROUTERS", "ROUTER_DEFAULTS", "SLO_NAMES", "FailureSpec", "PoolSpec", "Scenario", "SloTarget",
           "load_scenario"]


@dataclass
class Scenario:
    workload: dict
    pools: list[PoolSpec]
    duration: float | None
    router: SimRouter
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
    pools = [pool_spec(doc.at("pools", i), base, doc) for i in range(len(d["pools"]))]
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise doc.error(("pools",), f"pool names must be unique, got {names}")
    sections = {k: d.get(k, {}) for k in ("metrics", "output", "drain")}
    sc = Scenario(
        workload=workload,
        pools=pools,
        duration=float(d["duration"]) if "duration" in d else None,
        router=router_config(doc.at("router") if "router" in d else None, base, pools[0].block_size),
        slos=[SloTarget.from_yaml(metric, v) for metric, v in d.get("slo", {}).items()],
        base_dir=base,
        name=str(d.get("name", name)),
        **given(d, {"seed": ("seed", int), "currency": ("currency", str), "warmup": ("warmup", float)}),
        **given(sections["metrics"], {"scrape_interval": ("scrape_interval", float)}),
        **given(sections["metrics"], {"rate_window": ("rate_window", float)}),
        **given(sections["metrics"], {"evaluation_interval": ("evaluation_interval", float)}),
        rules=recording_rules(doc.at("metrics"), base) if "metrics" in d else [],
        **given(sections["output"], {"timeline_interval": ("timeline_interval", float)}),
        **given(sections["drain"], {"enabled": ("drain_after_end", bool), "max": ("max_drain", float)}),
        pd=pd_config(doc.at("pd"), pools) if "pd" in d else None,
    )
    if sc.pd is not None and sc.router.config.flow_control:
        raise doc.error(("router",), "flow control is not modelled with a P/D service")
    if sc.warmup and sc.duration is not None and sc.warmup >= sc.duration:
        raise doc.error(("warmup",), f"must be below the duration ({sc.duration:g} s), got {sc.warmup:g}")
    span = (sc.duration or 0.0) + (sc.max_drain if sc.drain_after_end else 0.0)
    check_limits(doc, workload, sc.duration, span, pools, sc.scrape_interval, sc.rate_window,
                 sc.timeline_interval, sc.router)
    return sc
