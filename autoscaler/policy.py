"""The policy interface: Observation in, Decision out, state as a plain dict.

A policy never reads a clock or does I/O; the caller passes `obs.time`. It is called once every
`polling_interval` seconds (the caller may call it more or less often; policies use obs.time, not
call counts). Its whole memory is returned by state_dict() as JSON-able data, so that a controller can
persist it and a replay can resume.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.observation import Observation


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    active: bool  # KEDA's notion: some trigger is above its activation threshold
    reason: str


class Policy:
    polling_interval: float = 30.0
    min_replicas: int = 0
    max_replicas: int = 100
    # True when decide() reads obs.errors itself (KEDA's fallback); otherwise a failed metric makes
    # the reconcile step hold the current count rather than decide on a partial picture
    handles_errors: bool = False

    def decide(self, obs: Observation) -> Decision:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
