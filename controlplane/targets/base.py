"""The scale-target edge: where a clamped decision becomes replicas.

The reconcile step (autoscaler.reconcile) calls only `scale(desired, reason)`. The live controller also
reads `replicas()` on every tick to fill the Observation's current and ready counts, and `starting()`
for the dashboard and for `Observation.starting_replicas`:

    step = reconcile(policy, obs, target)         # -> target.scale(desired, reason)
    current, ready = target.replicas()            # current: what the target holds as desired
    obs.starting_replicas = target.starting()     # provisioned, not ready yet

A target that refuses or fails raises ScaleError and keeps its last applied state; the caller retries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from autoscaler.reconcile import ScaleError

__all__ = ["Replicas", "ScaleError", "Target"]


class Replicas(NamedTuple):
    current: int  # the desired (spec) replica count the target holds, ready or not
    ready: int  # replicas that pass their health check


class Target(ABC):
    """One scalable thing (a local process fleet, a Deployment's scale subresource, a simulator pool)."""

    name: str = ""

    @abstractmethod
    def scale(self, desired: int, reason: str) -> None:
        """Sets the desired replica count; raises ScaleError (and changes nothing) on failure."""

    @abstractmethod
    def replicas(self) -> Replicas:
        """(current, ready) now."""

    def starting(self) -> int:
        """Replicas provisioned but not ready yet; 0 where the target cannot tell cheaply."""
        return 0
