"""Knative's KPA (knative/serving pkg/autoscaler/scaling/autoscaler.go, v1.18): stable and panic windows.

`kpa_scale` is the decider itself on already-averaged stable/panic values (table-tested against
TestAutoscalerScale); `KpaPolicy` keeps the per-tick samples and averages them over the two windows,
the way Knative's metric collector does (concurrency = running + waiting requests, or the arrival rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy


@dataclass
class KpaSpec:
    target_value: float  # per-pod target after utilization (containerConcurrency x targetUtilization)
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    panic_threshold: float = 2.0  # 200%
    stable_window: float = 60.0
    panic_window: float = 6.0  # 10% of the stable window
    reachable: bool = True
    activation_scale: int = 1
    scale_down_delay: float = 0.0


@dataclass
class KpaState:
    panic_time: float | None = None
    max_panic_pods: int = 0


def kpa_scale(
    spec: KpaSpec, state: KpaState, ready_pods: int, stable: float, panic: float, now: float
) -> int:
    """One Scale() call: the desired pod count; mutates state (panic mode)."""
    ready = max(1.0, float(ready_pods))
    max_up = math.ceil(spec.max_scale_up_rate * ready)
    max_down = math.floor(ready / spec.max_scale_down_rate) if spec.reachable else 0.0
    dspc = math.ceil(stable / spec.target_value)
    dppc = math.ceil(panic / spec.target_value)
    desired_stable = int(min(max(dspc, max_down), max_up))
    desired_panic = int(min(max(dppc, max_down), max_up))
    if spec.activation_scale > 1:
        if dspc > 0 and spec.activation_scale > desired_stable:
            desired_stable = spec.activation_scale
        if dppc > 0 and spec.activation_scale > desired_panic:
            desired_panic = spec.activation_scale
    over = dppc / ready >= spec.panic_threshold
    if over:
        state.panic_time = now  # start, or extend, panicking
    elif state.panic_time is not None and state.panic_time + spec.stable_window < now:
        state.panic_time, state.max_panic_pods = None, 0  # the surge reached the stable window
    desired = desired_stable
    if state.panic_time is not None:
        desired = max(desired, desired_panic)
        state.max_panic_pods = max(state.max_panic_pods, desired)  # never scale down while panicking
        desired = state.max_panic_pods
    return desired


class KpaPolicy(Policy):
    def __init__(
        self,
        spec: KpaSpec,
        metric: str = "concurrency",
        min_replicas: int = 0,
        max_replicas: int = 100,
        polling_interval: float = 2.0,
    ):
        self.spec, self.metric = spec, metric
        self.min_replicas, self.max_replicas, self.polling_interval = (
            min_replicas,
            max_replicas,
            polling_interval,
        )
        self.state = KpaState()
        self.samples: list[list[float]] = []  # [time, value]
        self.delay: list[list[float]] = []  # [time, desired] for scale-down delay

    def state_dict(self) -> dict:
        return {
            "panic_time": self.state.panic_time,
            "max_panic_pods": self.state.max_panic_pods,
            "samples": self.samples,
            "delay": self.delay,
        }

    def load_state_dict(self, state: dict) -> None:
        self.state = KpaState(state.get("panic_time"), state.get("max_panic_pods", 0))
        # a saved window never holds a sample no decision could use (one would stall it)
        self.samples = [list(x) for x in state.get("samples", []) if all(map(math.isfinite, x))]
        self.delay = [list(x) for x in state.get("delay", [])]

    def _value(self, obs: Observation) -> float | None:
        if self.metric == "rps":
            return obs.arrival_rate
        if obs.num_running is None and obs.num_waiting is None:
            return None
        return (obs.num_running or 0.0) + (obs.num_waiting or 0.0)

    def decide(self, obs: Observation) -> Decision:
        v = self._value(obs)
        if v is None:
            return Decision(obs.current_replicas, False, "kpa: no data, no change")
        if not math.isfinite(v) or v < 0:  # a failed read: never enters the windows
            return Decision(obs.current_replicas, obs.current_replicas > 0,
                            f"kpa: unusable value {v!r}, keeping {obs.current_replicas}")
        now = obs.time
        self.samples.append([now, v])
        self.samples = [s for s in self.samples if s[0] > now - self.spec.stable_window]
        stable = sum(s[1] for s in self.samples) / len(self.samples)
        recent = [s[1] for s in self.samples if s[0] > now - self.spec.panic_window] or [v]
        panic = sum(recent) / len(recent)
        desired = kpa_scale(self.spec, self.state, obs.ready, stable, panic, now)
        if self.spec.scale_down_delay > 0:  # max over the delay window, as Knative's delayWindow
            self.delay.append([now, desired])
            self.delay = [d for d in self.delay if d[0] > now - self.spec.scale_down_delay]
            desired = int(max(d[1] for d in self.delay))
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        mode = "panic" if self.state.panic_time is not None else "stable"
        return Decision(desired, v > 0, f"kpa: {mode} stable={stable:.2f} panic={panic:.2f}")
