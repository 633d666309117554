"""KEDA ScaledObject semantics on top of the HPA arithmetic, as one pure policy.

Follows kedacore/keda v2.17 (pkg/scaling/executor/scale_scaledobjects.go, pkg/fallback, the Prometheus
scaler): KEDA itself moves 0 <-> 1 (or to minReplicaCount / idleReplicaCount) on activation, waits
cooldownPeriod after the last active time before deactivating, and leaves everything in between to the
HPA it creates (minReplicas = max(minReplicaCount, 1), external metrics AverageValue by default).
One simplification: KEDA's loop and the HPA's 15 s sync are evaluated together at each polling tick;
when KEDA changes the count at a tick the HPA acts from the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler import hpa, hpa_behavior, hpa_replicas
from autoscaler.expr import Formula, FormulaError
from autoscaler.hpa_replicas import average_value_replicas, value_replicas
from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.prometheus import QueryError, null_value


@dataclass
class Trigger:
    name: str  # trigger name, else s0, s1, ... in trigger order
    query: str
    threshold: float
    activation_threshold: float = 0.0
    metric_type: str = "AverageValue"
    ignore_null_values: bool = True
    server_address: str = ""


@dataclass
class ScalingModifiers:
    formula: str
    target: float
    activation_target: float = 0.0
    metric_type: str = "AverageValue"


@dataclass
class Fallback:
    failure_threshold: int
    replicas: int
    behavior: str = "static"


@dataclass
class KedaConfig:
    triggers: list[Trigger]
    min_replica_count: int = 0
    max_replica_count: int = 100
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    initial_cooldown_period: float = 0.0
    idle_replica_count: int | None = None
    fallback: Fallback | None = None
    behavior: hpa_behavior.Behavior | None = None  # advanced.horizontalPodAutoscalerConfig.behavior
    modifiers: ScalingModifiers | None = None
    tolerance: hpa_replicas.Tolerances = field(default_factory=hpa_replicas.Tolerances)
    creation_time: float = 0.0  # for initialCooldownPeriod when never active
    activation: bool = True  # False = a plain HPA on the same triggers (no scale to zero)


def fallback_replicas(fb: Fallback, current: int) -> int:
    if fb.behavior == "currentReplicas":
        return current
    if fb.behavior == "currentReplicasIfHigher":
        return max(current, fb.replicas)
    if fb.behavior == "currentReplicasIfLower":
        return min(current, fb.replicas)
    return fb.replicas


# the scalingModifiers formula's entry in errors and failures (no trigger name has a dot)
FORMULA = "scalingModifiers.formula"


class KedaPolicy(Policy):
    handles_errors = True  # failed triggers count toward the fallback's failureThreshold

    def __init__(self, cfg: KedaConfig):
        self.cfg = cfg
        self.polling_interval = cfg.polling_interval
        self.min_replicas = cfg.min_replica_count
        self.max_replicas = cfg.max_replica_count
        self.formula = Formula(cfg.modifiers.formula) if cfg.modifiers else None
        self.hpa_state = hpa.HpaState()
        self.last_active_time: float | None = None
        self.failures: dict[str, int] = {}

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "hpa": self.hpa_state.to_dict(),
            "last_active_time": self.last_active_time,
            "failures": dict(self.failures),
        }

    def load_state_dict(self, state: dict) -> None:
        self.hpa_state = hpa.HpaState.from_dict(state.get("hpa", {}))
        self.last_active_time = state.get("last_active_time")
        self.failures = dict(state.get("failures", {}))

    # ---- metrics -----------------------------------------------------------------------------
    def read_triggers(self, obs: Observation) -> tuple[dict[str, float], dict[str, str]]:
        """Trigger name -> value, and name -> error message, with KEDA's null/NaN/Inf rules."""
        values, errors = {}, {}
        for t in self.cfg.triggers:
            if t.name in obs.errors or (t.name not in obs.metrics and t.query not in obs.metrics):
                errors[t.name] = "query failed" if t.name in obs.errors else "no value for this trigger"
                continue
            raw = obs.metrics.get(t.name, obs.metrics.get(t.query))
            try:
                values[t.name] = null_value(raw, t.ignore_null_values)
            except QueryError as exc:
                errors[t.name] = str(exc)
        for t in self.cfg.triggers:  # consecutive failures, for the fallback
            self.failures[t.name] = self.failures.get(t.name, 0) + 1 if t.name in errors else 0
        return values, errors

    def _hpa_min(self) -> int:
        if not self.cfg.activation:
            return max(self.cfg.min_replica_count, 1)
        return self.cfg.min_replica_count if self.cfg.min_replica_count > 0 else 1

    def _proposal(
        self, name: str, value: float | None, target: float, metric_type: str, fb_name: str, obs: Observation
    ) -> int | None:
        fb = self.cfg.fallback
        if value is None:
            if (
                fb is not None
                and metric_type == "AverageValue"
                and self.failures.get(fb_name, 0) > fb.failure_threshold
            ):
                value = target * fallback_replicas(fb, obs.current_replicas)  # HPA then computes exactly that
            else:
                return None
        usage, target_m = hpa_replicas.to_milli(value), hpa_replicas.to_milli(target)
        if target_m <= 0:
            return None
        if metric_type == "Value":
            return value_replicas(obs.current_replicas, obs.ready, usage, target_m, self.cfg.tolerance)
        return average_value_replicas(obs.current_replicas, usage, target_m, self.cfg.tolerance)

    # ---- one tick --------------------------------------------------------------------------------
    def decide(self, obs: Observation) -> Decision:
        cfg, now, current = self.cfg, obs.time, obs.current_replicas
        values, errors = self.read_triggers(obs)
        composite = None
        if self.formula is not None:
            composite = self._composite(values, errors)
            active = composite is not None and composite > cfg.modifiers.activation_target
            is_error = composite is None
        else:
            active = any(values[t.name] > t.activation_threshold for t in cfg.triggers if t.name in values)
            is_error = bool(errors)
        err_note = ""
        if errors:
            shown = sorted(n for n in errors if n != FORMULA) + [errors[n] for n in errors if n == FORMULA]
            err_note = f" (errors: {', '.join(shown)})"

        if cfg.activation:
            step = self._keda_step(now, current, active, is_error)
            if step is not None:
                return Decision(step[0], active, step[1] + err_note)

        if current == 0 and self._hpa_min() != 0:
            return Decision(0, active, "ScalingDisabled: replicas are 0, waiting for activation" + err_note)
        if self.formula is not None:
            m = cfg.modifiers
            proposals = [
                self._proposal("composite", composite, m.target, m.metric_type, cfg.triggers[0].name, obs)
            ]
            if (
                composite is None and cfg.fallback is not None
            ):  # composite fallback: any trigger over threshold
                names = [t.name for t in cfg.triggers] + [FORMULA]
                if any(self.failures.get(n, 0) > cfg.fallback.failure_threshold for n in names):
                    proposals = [fallback_replicas(cfg.fallback, current)]
        else:
            proposals = [
                self._proposal(t.name, values.get(t.name), t.threshold, t.metric_type, t.name, obs)
                for t in cfg.triggers
            ]
        desired, reason = hpa.reconcile(
            self.hpa_state, now, current, self._hpa_min(), cfg.max_replica_count, proposals, cfg.behavior
        )
        return Decision(desired, active, f"hpa: {reason}" + err_note)

    def _composite(self, values: dict[str, float], errors: dict[str, str]) -> float | None:
        """The formula's value; None when a trigger failed or the formula did (then an error under
        FORMULA, counted toward the fallback like a failed trigger)."""
        if errors:
            return None
        try:
            value = self.formula(values)
        except FormulaError as exc:
            errors[FORMULA] = str(exc)
            self.failures[FORMULA] = self.failures.get(FORMULA, 0) + 1
            return None
        self.failures[FORMULA] = 0
        return value

    def _keda_step(self, now: float, current: int, active: bool, is_error: bool) -> tuple[int, str] | None:
        """KEDA's RequestScale; None = nothing for KEDA to do, the HPA decides."""
        cfg = self.cfg
        min_r, idle = cfg.min_replica_count, cfg.idle_replica_count
        if active:
            if (idle is not None and current < min_r) or current == 0:
                self.last_active_time = now
                return (min_r if min_r > 0 else 1), "keda: activated (scale from zero/idle)"
            if not is_error:
                self.last_active_time = now
            return None
        if is_error and cfg.fallback is not None and cfg.fallback.replicas != 0:
            return None  # the HPA applies fallback.replicas after failureThreshold
        if is_error and cfg.fallback is None:
            return current, "keda: triggers failing, no fallback: no change"
        if (idle is not None and current > idle) or (current > 0 and min_r == 0):
            if self.last_active_time is None:
                passed = cfg.creation_time + cfg.initial_cooldown_period < now
            else:
                passed = self.last_active_time + cfg.cooldown_period < now
            if passed:
                target = idle if idle is not None else min_r
                return target, f"keda: deactivated after cooldown ({'idle' if idle is not None else 'min'})"
            return None  # cooling down: the HPA keeps its floor of max(min, 1)
        if idle is None and current < min_r:
            return min_r, "keda: raised to minReplicaCount"
        return None
