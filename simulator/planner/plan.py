"""Plan files: what to plan for, validated strictly (simulator.planner.schema), errors naming file,
line and field. The engine grid is expanded here into candidates: every deployment under every
combination of the listed engine settings.

    plan = load_plan("examples/plan_h100_a100.yaml")
    [c.name for c in plan.candidates]   # ['h100-tp4/max_num_seqs=128', ...]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.spec import load_spec
from autoscaler.validation import check
from autoscaler.yamlfile import Document, document, parse
from simulator.latency import is_model_path, load_latency_model, model_ref
from simulator.planner.schema import PLAN, POOL_KEYS
from simulator.planner.traffic import scaled_workload
from simulator.scenario import load_scenario
from simulator.scenario_router import resolved_router
from simulator.scenario_schema import dist_at, resolve
from simulator.scenario_workload import workload_config

SEARCH_DEFAULTS = {"start_rate": 1.0, "step": 0.05, "duration": 600.0, "drain": 300.0, "max_replicas": 256,
                   "check_duration": 900.0, "max_duration": 1800.0}
ROUTER_DEFAULT = {"policy": "least_outstanding"}


@dataclass(frozen=True)
class Deployment:
    name: str
    pool: dict  # the scenario pool's fields (latency model resolved)
    gpus_per_replica: int
    price_per_gpu_hour: float
    offload_cost_per_hour: float = 0.0  # its KV offload tier's host memory (simulator.kvtier), a replica

    @property
    def gpu_cost_per_hour(self) -> float:
        return self.gpus_per_replica * self.price_per_gpu_hour

    @property
    def cost_per_hour(self) -> float:
        return self.gpu_cost_per_hour + self.offload_cost_per_hour


@dataclass(frozen=True)
class Candidate:
    deployment: Deployment
    engine: dict  # the engine settings of this grid point

    @property
    def name(self) -> str:
        return "/".join([self.deployment.name] + [f"{k}={v}" for k, v in self.engine.items()])

    def pool(self, replicas: int) -> dict:
        d = self.deployment
        # the scenario adds the offload tier's price to the pool's cost_per_hour itself
        return {**d.pool, **self.engine, "name": d.name, "replicas": replicas,
                "cost_per_hour": d.gpu_cost_per_hour}


@dataclass(frozen=True)
class PlanPolicy:
    name: str
    autoscaler: dict  # a scenario's autoscaler entry, the spec inline


@dataclass
class Plan:
    name: str
    seeds: list[int]
    duration: float  # of the curve as planned for (before compression), seconds
    compress: float  # the curve is simulated this many times faster
    workload: dict  # the scenario workload section, growth and compression applied
    slo: dict
    startup_delay: object
    router: dict
    currency: str
    candidates: list[Candidate]
    policies: list[PlanPolicy]
    autoscale: str  # all | cheapest_per_deployment
    search: dict = field(default_factory=lambda: search_settings({}))
    pd: dict | None = None  # the P:D search's section (simulator.planner.pd_plan), None: not asked

    @property
    def sim_duration(self) -> float:
        return self.duration / self.compress


def load_plan(source: str | Path | dict) -> Plan:
    """A plan from a YAML file path, YAML text or a dict; relative paths resolve against its folder."""
    base, name = Path("."), "plan"
    if isinstance(source, dict):
        doc = document(source)
    elif "\n" not in str(source) and Path(source).is_file():
        p = Path(source)
        base, name = p.resolve().parent, p.stem
        doc = parse(p.read_text(), str(source))
    elif isinstance(source, str) and "\n" in source:
        doc = parse(source)
    else:
        raise FileNotFoundError(f"plan file not found: {source}")
    if not isinstance(doc.data, dict):
        raise doc.error((), "a plan must be a mapping with workload, slo and deployments")
    check(PLAN, doc)
    d = doc.data
    workload_config(doc.at("workload"), base)  # the scenario's own checks, naming the plan's lines
    if "duration" not in d:
        raise doc.error(("duration",), "is required: the length of the curve to plan for, in seconds")
    deployments = [_deployment(doc.at("deployments", i), base) for i in range(len(d["deployments"]))]
    _unique(doc, "deployments", [x.name for x in deployments])
    engine = d.get("engine", {})
    grid = [dict(zip(engine, values)) for values in itertools.product(*engine.values())]
    policies = [_policy(doc.at("policies", i), base) for i in range(len(d.get("policies", [])))]
    _unique(doc, "policies", [p.name for p in policies])
    compress = float(d.get("compress", 1.0))
    if "startup_delay" in d:
        dist_at(doc, "startup_delay")
    plan = Plan(
        name=str(d.get("name", name)),
        seeds=[int(s) for s in d.get("seeds", [0])],
        duration=float(d["duration"]),
        compress=compress,
        workload=scaled_workload(resolved_workload(d["workload"], base), float(d.get("growth", 1.0)),
                                 compress),
        slo=d["slo"],
        startup_delay=d.get("startup_delay", 0.0),
        router=resolved_router(d.get("router", ROUTER_DEFAULT), base),
        currency=str(d.get("currency", "USD")),
        candidates=[Candidate(dep, e) for dep in deployments for e in grid],
        policies=policies,
        autoscale=str(d.get("autoscale", "cheapest_per_deployment")),
        search=search_settings(d.get("search", {})),
        pd=d.get("pd"),
    )
    for key in ("prefill_deployment", "decode_deployment"):
        if plan.pd and key in plan.pd and plan.pd[key] not in [x.name for x in deployments]:
            raise doc.error(("pd", key), f"no deployment named {plan.pd[key]!r} "
                            f"(deployments: {', '.join(x.name for x in deployments)})")
    _check_as_scenarios(plan, doc)
    return plan


def search_settings(given: dict) -> dict:
    """The plan's search section with the defaults filled in."""
    out = {**SEARCH_DEFAULTS, **given}
    out.setdefault("peak_duration", out["duration"])
    return out


def _check_as_scenarios(plan: Plan, doc: Document) -> None:
    """Each deployment and policy as the simulator will read it (KV memory, limits, specs), so a bad one
    is reported before any run, naming its place in the plan."""
    first: dict[str, Candidate] = {}  # each deployment's first grid point, in the plan's order
    for cand in plan.candidates:
        first.setdefault(cand.deployment.name, cand)
    for i, cand in enumerate(first.values()):
        _try(doc, ("deployments", i), {**_scenario(plan), "pools": [cand.pool(1)]})
    for j, p in enumerate(plan.policies):
        pool = {**plan.candidates[0].pool(1), "autoscaler": p.autoscaler}
        _try(doc, ("policies", j), {**_scenario(plan), "pools": [pool]})


def _scenario(plan: Plan) -> dict:
    return {"duration": 60.0, "workload": plan.workload, "slo": plan.slo, "router": plan.router}


def _try(doc: Document, where: tuple, scenario: dict) -> None:
    try:
        load_scenario(scenario)
    except ValueError as exc:
        raise doc.error(where, f"as a scenario: {exc}") from None


def _unique(doc: Document, key: str, names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise doc.error((key,), f"names must be unique, got {names}")


def resolved_workload(workload: dict, base: Path) -> dict:
    """The workload with its trace paths made absolute (the runs may happen anywhere)."""
    out = dict(workload)
    for key in ("trace", "lengths_from"):
        if key in out:
            out[key] = dict(out[key], path=resolve(out[key]["path"], base))
    return out


def _deployment(doc: Document, base: Path) -> Deployment:
    d = doc.data
    lm = model_ref(d["latency_model"])  # a derive mapping becomes its derived model's name
    lm = resolve(lm, base) if is_model_path(lm) else lm
    try:
        model = load_latency_model(lm)
    except ValueError as exc:
        raise doc.error(("latency_model",), str(exc)) from None
    gpus = int(d.get("gpus_per_replica", model.tp))
    pool = {k: d[k] for k in POOL_KEYS if k in d} | {"latency_model": lm}
    if "kv_memory" in pool:
        pool["kv_memory"] = {"num_gpus": gpus, **pool["kv_memory"]}
    offload = _offload_cost(doc, {**pool, "name": d["name"]}) if "kv_offload" in pool else 0.0
    return Deployment(d["name"], pool, gpus, float(d["price_per_gpu_hour"]), offload)


def _offload_cost(doc: Document, pool: dict) -> float:
    """A replica's offload tier an hour, as the scenario prices it (its capacity in bytes needs the
    pool's block size and KV bytes a token)."""
    probe = {"duration": 1.0, "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 1, "output_tokens": 1},
             "pools": [pool]}
    try:
        return load_scenario(probe).pools[0].kv_offload.cost_per_hour
    except ValueError as exc:
        raise doc.error(("kv_offload",), f"as a scenario pool: {exc}") from None


def _policy(doc: Document, base: Path) -> PlanPolicy:
    d = doc.data
    spec = d["spec"]
    if isinstance(spec, str):
        path = resolve(spec, base)
        if not Path(path).is_file():
            raise doc.error(("spec",), f"file not found: {path}")
        try:
            load_spec(Path(path).read_text(), path=path)
            spec = parse(Path(path).read_text(), path).data
        except ValueError as exc:
            raise doc.error(("spec",), str(exc)) from None
    else:
        load_spec(doc.at("spec"))
    entry = {"spec": spec}
    if "latency_model" in d:
        lm = model_ref(d["latency_model"])
        entry["latency_model"] = resolve(lm, base) if is_model_path(lm) else lm
    return PlanPolicy(d["name"], entry)
