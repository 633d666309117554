"""A target that only holds a number: for dry runs and controller tests (with failures on demand)."""

from __future__ import annotations

from controlplane.targets.base import Replicas, ScaleError, Target


class MemoryTarget(Target):
    """Every replica is ready at once. `fail_next(n)` makes the next n scales raise ScaleError.

    `history` lists every applied (desired, reason), for tests and dry runs.
    """

    def __init__(self, replicas: int = 1, name: str = "memory", max_replicas: int | None = None):
        self.name = name
        self.current = replicas
        self.max_replicas = max_replicas
        self.history: list[tuple[int, str]] = []
        self._failures = 0

    def fail_next(self, n: int = 1) -> None:
        self._failures = n

    def scale(self, desired: int, reason: str) -> None:
        if self._failures > 0:
            self._failures -= 1
            raise ScaleError(f"{self.name}: injected failure scaling to {desired}")
        if desired < 0 or (self.max_replicas is not None and desired > self.max_replicas):
            raise ScaleError(f"{self.name}: {desired} replicas is outside [0, {self.max_replicas}]")
        self.current = desired
        self.history.append((desired, reason))

    def replicas(self) -> Replicas:
        return Replicas(self.current, self.current)
