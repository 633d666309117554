"""One workload under several policies, beside the static fleet for its peak and the oracle lower bound.

    result = run_compare("examples/keda_queue.yaml", ["a.yaml", "b.yaml"], runner)

Each spec replaces the scenario's autoscalers (every pool's), exactly as a scenario file saying
`autoscaler: {spec: FILE}` would, so each row equals `slopilot simulate` of that file. The static and
oracle rows follow the planner: the peak is the busiest minute of the workload's arrivals, the static
fleet the smallest replica count meeting every SLO at that rate (from a one-replica capacity search),
and the oracle bills, per minute, that fleet's per-replica share of the peak (simulator.planner.oracle).
They need a single pool.
"""

from __future__ import annotations

import copy
from pathlib import Path

from autoscaler.spec import load_spec
from autoscaler.yamlfile import parse
from simulator.latency import is_model_path, load_latency_model
from simulator.planner.capacity import capacity_task
from simulator.planner.oracle import oracle
from simulator.planner.plan import (
    SEARCH_DEFAULTS,
    Candidate,
    Deployment,
    Plan,
    resolved_workload,
    search_settings,
)
from simulator.planner.rows import oracle_row, run_row
from simulator.planner.stages import static_task
from simulator.planner.sweep import Job, drive
from simulator.planner.traffic import trace_peak
from simulator.scenario import load_scenario
from simulator.scenario_router import resolved_router
from simulator.scenario_schema import resolve

# a pool's fields that the sizing runs set themselves
POOL_ONLY = ("name", "replicas", "autoscaler", "provisioning_delay", "startup_delay", "failure",
             "cost_per_hour")
STATIC, ORACLE = "static peak", "oracle lower bound"


def run_compare(scenario: str, specs: list[str], runner, duration: float | None = None,
                seed: int | None = None, capacity_duration: float = SEARCH_DEFAULTS["duration"],
                bounds: bool = True, progress=None) -> dict:
    """Every row simulated on `runner`; returns compare.json's content."""
    from simulator.run import build_workload

    sc = load_scenario(scenario, duration=duration)
    seed = sc.seed if seed is None else seed
    raw = parse(Path(scenario).read_text(), scenario).data
    raw = {**raw, "name": sc.name, **({"duration": duration} if duration is not None else {})}
    base = str(sc.base_dir)
    named = spec_rows(specs)
    tasks = {name: _one(Job(with_autoscaler(raw, {"spec": path}), seed, True, base))
             for name, path in named.items()}
    single_pool = len(sc.pools) == 1
    times = build_workload(sc, seed).times
    runs: list = []
    if bounds and single_pool:
        tasks[STATIC] = sizing_task(sc, raw, seed, times, capacity_duration, runs)
    done = drive(tasks, runner, progress)
    rows = [run_row(name, "spec", done[name]["summary"], done[name]["timeline"], spec=path)
            for name, path in named.items()]
    out = {"scenario": sc.name, "seed": seed, "duration": sc.duration, "currency": sc.currency, "rows": rows,
           "bounds": None if single_pool else "the static and oracle rows need a single pool"}
    sizing = done.get(STATIC)
    if sizing and sizing.get("run"):
        n = sizing["static"]["replicas"]
        label = f"{STATIC} ({n} replica{'' if n == 1 else 's'})"
        rows.append(run_row(label, "static", sizing["run"]["summary"], sizing["run"]["timeline"]))
        startup = sc.pools[0].provisioning_delay.mean()
        _, billed = oracle(times, sc.duration or float(times[-1]), sizing["peak_rps"] / n, startup)
        rows.append(oracle_row(ORACLE, billed, sizing["gpus_per_replica"], sc.pools[0].cost_per_hour))
        out["sizing"] = {**{k: v for k, v in sizing.items() if k != "run"}, "capacity_runs": runs}
        for r in rows:
            r["x_oracle"] = r["gpu_hours"] / rows[-1]["gpu_hours"] if rows[-1]["gpu_hours"] else None
    return out


def spec_rows(specs: list[str]) -> dict[str, str]:
    """Row name -> the spec's absolute path; each spec validated. The row is named by the spec's
    metadata.name; specs sharing a name are told apart by their files: `name (file)`."""
    named: list[tuple[str, str, Path]] = []
    for spec in specs:
        path = Path(spec).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"--spec {spec}: file not found")
        name = load_spec(path.read_text(), path=spec).name
        if name.startswith((STATIC, ORACLE)):
            name = f"spec {name}"
        named.append((name, spec, path))
    names = [n for n, _, _ in named]
    rows: dict[str, str] = {}
    for name, spec, path in named:
        if names.count(name) > 1:
            files = [p.name for p in {p for n, _, p in named if n == name}]
            # the file's name, or the path as given where two share a file name
            name = f"{name} ({path.name if files.count(path.name) == 1 else spec})"
        label, k = name, 2
        while label in rows:  # the same file given twice
            label, k = f"{name} #{k}", k + 1
        rows[label] = str(path)
    return rows


def with_autoscaler(raw: dict, autoscaler: dict, replicas: int | None = None) -> dict:
    """The scenario with every pool under this autoscaler entry (and `replicas` to start, if given)."""
    d = copy.deepcopy(raw)
    for pool in d["pools"]:
        pool.pop("autoscaler", None)
        if replicas is not None:
            pool["replicas"] = replicas
    d["autoscaler"] = autoscaler
    return d


def sizing_plan(sc, raw: dict, seed: int, capacity_duration: float) -> tuple[Plan, Candidate]:
    """The scenario's single pool as a one-candidate plan, for the capacity and static-fleet searches."""
    pool = {k: v for k, v in raw["pools"][0].items() if k not in POOL_ONLY}
    lm = pool["latency_model"]
    pool["latency_model"] = resolve(lm, sc.base_dir) if is_model_path(lm) else lm
    spec = sc.pools[0]
    gpus = max(int((spec.kv_memory or {}).get("num_gpus", 1)), load_latency_model(pool["latency_model"]).tp)
    dep = Deployment(spec.name, pool, gpus, spec.cost_per_hour / gpus)
    plan = Plan(sc.name, [seed], sc.duration or 0.0, 1.0, resolved_workload(raw["workload"], sc.base_dir),
                raw.get("slo", {}), 0.0, resolved_router(raw.get("router", {}), sc.base_dir), sc.currency,
                [Candidate(dep, {})], [], "all", search_settings({"duration": capacity_duration}))
    return plan, plan.candidates[0]


def sizing_task(sc, raw: dict, seed: int, times, capacity_duration: float, runs: list):
    """Capacity, the static fleet at the workload's peak minute, and that fleet over the workload."""
    plan, cand = sizing_plan(sc, raw, seed, capacity_duration)
    peak = trace_peak(times)
    cap = yield from capacity_task(plan, cand, runs)
    static = (yield from static_task(plan, cand, peak, cap["rps"])) if cap["rps"] > 0 else None
    out = {"peak_rps": peak, "capacity": cap, "static": static,
           "gpus_per_replica": cand.deployment.gpus_per_replica}
    if static and static["replicas"]:
        n = static["replicas"]
        job = Job(with_autoscaler(raw, {"fixed": n}, n), seed, True, str(sc.base_dir))
        out["run"] = yield from _one(job)
    return out


def _one(job: Job):
    results = yield [job]
    return results[0]
