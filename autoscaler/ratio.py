"""The SLO-aware ratio law that llm-d ships (guides/workload-autoscaling, "slo-aware").

    s = max over SLOs of observed percentile / target   (no traffic or NaN -> 0), clamped at `clamp`,
    averaged over the last `window` seconds;
    with n provisioned and r ready replicas, in-flight credit c = r / n:
      s > up   : desired = n + ceil(n * (s * c / up - 1))   (never below n: starting replicas are credit)
      s < down : desired = n - floor(n * (1 - s / down))
      otherwise: hold (the dead band).
Defaults up 0.55, down 0.40, clamp 2.0, window 45 s.
"""

from __future__ import annotations

import math

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.slo import SloTarget

__all__ = ["RatioPolicy", "SloTarget", "observed_percentile", "ratio_step", "slo_ratio"]


def observed_percentile(obs: Observation, metric: str, percentile: float) -> float | None:
    table = obs.ttft_p if metric == "ttft" else (obs.tpot_p or obs.itl_p)
    return table.get(percentile)  # 90 and 90.0 are the same dict key


def slo_ratio(obs: Observation, slos: list[SloTarget], clamp: float = 2.0) -> float:
    """max(observed / target) over the SLOs; 0 when there is no traffic or a value is missing/NaN."""
    if obs.arrival_rate is not None and obs.arrival_rate <= 0:
        return 0.0
    s = 0.0
    for slo in slos:
        v = observed_percentile(obs, slo.metric, slo.percentile)
        if v is None or math.isnan(v):
            continue
        s = max(s, v / slo.seconds)
    return min(s, clamp)


def ratio_step(n: int, ready: int, s: float, up: float = 0.55, down: float = 0.40) -> int:
    """The desired count from the smoothed ratio s (pure; table-tested)."""
    if n <= 0:
        return 1 if s > 0 else 0
    if s > up:
        credit = min(ready, n) / n
        return max(n, n + math.ceil(n * (s * credit / up - 1)))
    if s < down:
        return n - math.floor(n * (1 - s / down))
    return n


class RatioPolicy(Policy):
    def __init__(
        self,
        slos: list[SloTarget],
        min_replicas: int = 1,
        max_replicas: int = 100,
        polling_interval: float = 15.0,
        up: float = 0.55,
        down: float = 0.40,
        clamp: float = 2.0,
        window: float = 45.0,
    ):
        if not slos:
            raise ValueError("spec.slo: the ratio policy needs at least one SLO (ttft or tpot)")
        self.slos, self.up, self.down, self.clamp, self.window = slos, up, down, clamp, window
        self.min_replicas, self.max_replicas, self.polling_interval = (
            min_replicas,
            max_replicas,
            polling_interval,
        )
        self.samples: list[list[float]] = []  # [time, s]

    def state_dict(self) -> dict:
        return {"samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        self.samples = [list(x) for x in state.get("samples", [])]

    def smoothed(self, obs: Observation) -> float:
        self.samples.append([obs.time, slo_ratio(obs, self.slos, self.clamp)])
        self.samples = [x for x in self.samples if x[0] > obs.time - self.window] or self.samples[-1:]
        return sum(x[1] for x in self.samples) / len(self.samples)

    def decide(self, obs: Observation) -> Decision:
        s = self.smoothed(obs)
        n = obs.current_replicas
        desired = min(
            max(ratio_step(n, obs.ready, s, self.up, self.down), self.min_replicas), self.max_replicas
        )
        band = "scale up" if s > self.up else ("scale down" if s < self.down else "hold (dead band)")
        return Decision(desired, s > 0, f"ratio: s={s:.3f} {band}")
