"""The sweep on a Ray cluster (`--ray ADDRESS`, `auto`, or `local` for a Ray instance started here).
Ray is optional (`pip install ray`); every node needs slopilot installed, and latency models, traces or
specs given as paths must exist at the same paths there."""

from __future__ import annotations

from collections.abc import Callable


class RayRunner:
    """Runs `run_job` (simulator.planner.sweep.run_job) as Ray tasks."""

    def __init__(self, address: str, workers: int | None, run_job: Callable):
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs the ray package: pip install ray") from None
        self.ray = ray
        options = {"num_cpus": workers} if address == "local" and workers else {}
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, **options)
        self.remote = ray.remote(run_job)

    def submit(self, job):
        return self.remote.remote(job)

    def done(self, handles: list) -> list:
        ready, _ = self.ray.wait(handles, num_returns=1)
        return ready

    def result(self, handle) -> dict:
        return self.ray.get(handle)

    def close(self) -> None:
        self.ray.shutdown()
