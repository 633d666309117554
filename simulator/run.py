"""One simulation run: scenario -> workload -> fleet -> results (and optionally the output folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.fleet import Fleet
from simulator.scenario import Scenario, load_scenario
from simulator.workload import RateCurve, Workload, from_trace, load_trace, synthetic


def build_workload(sc: Scenario, seed: int) -> Workload:
    w = sc.workload
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    if "trace" in w:
        t = w["trace"]
        wl = from_trace(
            load_trace(t),
            rng,
            t.get("rate_scale", 1.0),
            t.get("time_scale", 1.0),
            t.get("start", 0.0),
            t.get("duration", sc.duration),
            t.get("limit"),
        )
    else:
        a = w["arrivals"]
        curve = RateCurve(**a["curve"], spikes=a["spikes"])
        mix = load_trace(w["lengths_from"]) if "lengths_from" in w else None
        wl = synthetic(curve, sc.duration, a["cv"], w.get("prompt_tokens"), w.get("output_tokens"), rng, mix)
    if w.get("max_prompt_tokens"):
        wl.prompt = np.minimum(wl.prompt, w["max_prompt_tokens"])
    if w.get("max_output_tokens"):
        wl.output = np.minimum(wl.output, w["max_output_tokens"])
    # a request never needs more than the smallest pool's context window
    max_len = min(p.max_model_len for p in sc.pools)
    wl.output = np.maximum(1, np.minimum(wl.output, max_len - wl.prompt))
    return wl


@dataclass
class SimResult:
    summary: dict
    fleet: Fleet


def simulate(
    scenario,
    out_dir: str | Path | None = None,
    seed: int | None = None,
    progress: bool = False,
    fast: bool = True,
    models: dict | None = None,
    plots: bool = True,
    workload: Workload | None = None,
) -> SimResult:
    """Runs a scenario (a Scenario, a path or a dict); writes DIR when given."""
    from simulator.output import write_outputs
    from simulator.report import summarize

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    seed = sc.seed if seed is None else seed
    wl = workload if workload is not None else build_workload(sc, seed)
    fleet = Fleet(sc, wl, seed=seed, fast=fast, models=models, progress=progress)
    fleet.run()
    summary = summarize(fleet)
    if out_dir is not None:
        write_outputs(fleet, summary, Path(out_dir), plots=plots)
    return SimResult(summary, fleet)
