"""Running many simulations: a job is a scenario dict and a seed, its result the run's summary; the
runner is a local process pool, Ray, or this process. Every job is a pure function of its scenario and
seed, so the results are the same whichever runs them and in whatever order they finish.

    results = drive({"a": task_a(), "b": task_b()}, make_runner(workers=2))

A task is a generator that yields a list of jobs and is sent back their results in the same order;
its return value is the task's answer. The driver keeps every worker busy across tasks.
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing
import os
from collections.abc import Generator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    scenario: dict  # a scenario as load_scenario reads it
    seed: int
    timeline: bool = False  # also return replicas and arrival rate over time
    base_dir: str | None = None  # where the scenario's relative paths start (None: they are absolute)
    steady: bool = False  # also return the stationarity of its queue (simulator.planner.steady)


def run_job(job: Job) -> dict:
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    base = Path(job.base_dir) if job.base_dir else None
    res = simulate(load_scenario(job.scenario, base_dir=base), seed=job.seed, plots=False)
    out = {"summary": res.summary}
    if job.timeline:
        out["timeline"] = replicas_over_time(res.fleet.timeline)
    if job.steady:
        from simulator.planner.steady import stationarity

        out["steady"] = stationarity(res.fleet)
    return out


def replicas_over_time(timeline: list[dict]) -> list[list[float]]:
    """[time, replicas (provisioning + ready), arrival rate] per timeline instant, pools summed."""
    rows: dict[float, list[float]] = {}
    for r in timeline:
        row = rows.setdefault(r["time"], [r["time"], 0.0, 0.0])
        row[1] += r["ready"] + r["provisioning"]
        row[2] += r["arrival_rate"]
    return [rows[t] for t in sorted(rows)]


def import_plugins() -> None:
    """A fresh worker imports the user's plugin modules (policy types, scorers, pickers) that the command
    loaded: `slopilot --plugin` leaves their names in SLOPILOT_PLUGINS (slopilot.plugins), and the spawn
    brings the parent's import path."""
    for name in os.environ.get("SLOPILOT_PLUGINS", "").split(","):
        if name.strip():
            importlib.import_module(name.strip())


class SerialRunner:
    """Runs each job in this process when asked for a finished one (tests, --workers 1)."""

    def __init__(self):
        self.jobs: dict[int, Job] = {}
        self.results: dict[int, dict] = {}
        self.handles = itertools.count()

    def submit(self, job: Job) -> int:
        handle = next(self.handles)
        self.jobs[handle] = job
        return handle

    def done(self, handles: list) -> list:
        h = handles[0]
        self.results[h] = run_job(self.jobs.pop(h))
        return [h]

    def result(self, handle) -> dict:
        return self.results.pop(handle)

    def close(self) -> None:
        pass


class PoolRunner:
    """A local process pool (fresh interpreters: no state shared with the parent)."""

    def __init__(self, workers: int):
        ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=import_plugins)

    def submit(self, job: Job):
        return self.pool.submit(run_job, job)

    def done(self, handles: list) -> list:
        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    def result(self, handle) -> dict:
        return handle.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def make_runner(workers: int | None = None, ray_address: str | None = None):
    """Ray when an address is given ('auto': the cluster this machine is part of; 'local': start one
    here), else a process pool of `workers` (default: one per CPU), or this process for 1."""
    if ray_address:
        from simulator.planner.rayrun import RayRunner

        return RayRunner(ray_address, workers, run_job)
    workers = workers or os.cpu_count() or 1
    return SerialRunner() if workers == 1 else PoolRunner(workers)


def drive(tasks: dict, runner, progress=None) -> dict:
    """Runs the tasks (key -> generator) to completion; returns key -> the task's return value."""
    answers: dict = {}
    pending: dict = {}  # handle -> (task key, index in its batch)
    batches: dict = {}  # task key -> the results of its batch so far

    def feed(key, sent) -> None:
        gen: Generator = tasks[key]
        try:
            jobs = next(gen) if sent is None else gen.send(sent)
            while not jobs:
                jobs = gen.send([])
        except StopIteration as stop:
            answers[key] = stop.value
            return
        batches[key] = [None] * len(jobs)
        for i, job in enumerate(jobs):
            pending[runner.submit(job)] = (key, i)
        if progress is not None:
            progress.add(len(jobs))

    for key in tasks:
        feed(key, None)
    while pending:
        for handle in runner.done(list(pending)):
            key, i = pending.pop(handle)
            batches[key][i] = runner.result(handle)
            if progress is not None:
                progress.advance()
            if all(r is not None for r in batches[key]):
                feed(key, batches.pop(key))
    return answers
