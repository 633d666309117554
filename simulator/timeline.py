"""The run's timeline (one row per pool every timeline interval) and the progress it drives: a bar on
a terminal, else (a log, CI) a line every 30 s with simulated time, requests and the ETA."""

from __future__ import annotations

import sys
import time

import numpy as np

from simulator.steptime import seconds, to_ps


def timeline_process(fleet, bar=None):
    """Appends a row per pool to fleet.timeline every interval; advances `bar` (progress, task)."""
    interval_s = fleet.sc.timeline_interval
    interval = to_ps(interval_s)
    last_arrived = 0
    while True:
        yield fleet.env.timeout(interval)
        t = seconds(fleet.env.now)
        arrived = fleet.arrived - last_arrived
        last_arrived = fleet.arrived
        for pool in fleet.pools:
            reps = [r for r in pool.replicas if r.state in ("ready", "draining")]
            ready = [r for r in reps if r.state == "ready"]
            first = pool.index == 0  # fleet-wide quantities go on the first pool's rows
            fleet.timeline.append(
                {
                    "time": t,
                    "pool": pool.spec.name,
                    "desired": pool.desired,
                    "provisioning": pool.count("provisioning"),
                    "ready": len(ready),
                    "draining": pool.count("draining"),
                    "arrival_rate": arrived / interval_s if first else 0.0,
                    "waiting": sum(r.num_waiting for r in reps) + (len(fleet.backlog) if first else 0),
                    "running": sum(r.num_running for r in reps),
                    "kv_usage": float(np.mean([r.kv_usage_now() for r in ready])) if ready else 0.0,
                }
            )
        if bar is not None:
            bar[0].update(bar[1], completed=min(fleet.env.now, fleet.horizon))


def progress_bar(total: int):
    """A transient rich progress bar over simulated time; returns (progress, task)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        transient=True,
    )
    progress.start()
    return progress, progress.add_task("sim", total=total)


class ProgressLines:
    """Off a terminal: one line on stderr every `every` wall seconds (the bar's update/stop interface)."""

    def __init__(self, fleet, total: int, every: float = 30.0, clock=time.monotonic, out=None):
        self.fleet, self.total, self.every, self.clock = fleet, total, every, clock
        self.out = out or sys.stderr
        self.start = self.last = clock()

    def update(self, _task, completed: int) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        done = completed / self.total if self.total else 1.0
        elapsed = now - self.start
        eta = f"ETA {elapsed * (1 - done) / done:.0f} s" if done > 0 else "ETA unknown"
        print(f"simulated {seconds(completed):,.0f} of {seconds(self.total):,.0f} s ({100 * done:.0f}%), "
              f"{self.fleet.arrived:,} requests arrived, {elapsed:.0f} s elapsed, {eta}", file=self.out,
              flush=True)

    def stop(self) -> None:
        pass


def progress_for(fleet, mode) -> tuple | None:
    """(bar, task) for timeline_process: a rich bar (mode True or "bar"), lines ("lines"), or None."""
    if mode == "lines":
        return ProgressLines(fleet, fleet.horizon), None
    return progress_bar(fleet.horizon) if mode else None
