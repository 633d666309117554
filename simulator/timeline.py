"""The run's timeline (one row per pool every timeline interval) and the progress bar it drives."""

from __future__ import annotations

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
