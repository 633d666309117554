"""One autoscaler resource's loop: the controller's AutoscalerLoop, with its state and conditions in
the resource's status instead of a file.

Each tick first checks that nobody else scales the target (an HPA, a KEDA ScaledObject, an older
autoscaler of ours); a refused autoscaler never acts. A missing target or an unreadable Scale sets a
condition and the loop goes on. After each reconcile the status gets the conditions, the replica
counts and the policy state; Events tell every scale and every failure.
"""

from __future__ import annotations

import logging

from autoscaler.reconcile import ScaleError, Step
from controlplane.controller import AutoscalerLoop
from controlplane.kube.events import EventRecorder, object_ref
from controlplane.kube.scale import KubeScaleTarget, NotLeader, TargetNotFound
from controlplane.kube.status import (
    StatusWriter,
    blocked_conditions,
    merge_conditions,
    now_rfc3339,
    step_conditions,
)

log = logging.getLogger("slopilot.kube")


class KubeLoop(AutoscalerLoop):
    def __init__(self, obj: dict, spec, policy, source, target: KubeScaleTarget, status: StatusWriter,
                 events: EventRecorder, latest, conflict_of, telemetry=None, log_file=None):
        """latest(): the resource as last seen (the watch cache); conflict_of(obj): (reason, message)
        when another autoscaler owns the target, else None."""
        super().__init__(spec, policy, source, target, state=None, log_file=log_file, telemetry=telemetry)
        meta = obj["metadata"]
        self.namespace, self.resource = meta.get("namespace", ""), meta["name"]
        self.name = f"{self.namespace}/{self.resource}" if obj.get("kind") == "InferenceAutoscaler" else \
            f"{self.namespace}/{obj.get('kind')}/{self.resource}"
        self.obj, self.latest, self.conflict_of = obj, latest, conflict_of
        self.status, self.events = status, events
        self.blocked: tuple[str, str] | None = None
        self._written: tuple[str, dict] | None = None  # (resourceVersion we wrote over, what we stored)
        target.on_scaled = self._event_scaled
        target.on_failed = self._event_scale_failed
        saved = (obj.get("status") or {}).get("policyState")
        if saved:
            policy.load_state_dict(saved.get("policy") or {})
            log.info("%s: resumed policy state saved at %s", self.name, saved.get("time"))

    def current(self) -> dict:
        """The resource as we know it best: the watch's copy, or ours if the watch has not caught up."""
        seen = self.latest() or self.obj
        if self._written and seen["metadata"].get("resourceVersion") == self._written[0]:
            return self._written[1]
        return seen

    def tick(self, now: float) -> Step | None:
        obj = self.current()
        conflict = self.conflict_of(obj)
        if conflict is not None:
            self.pending = None
            self._block(*conflict)
            return None
        try:
            step = super().tick(now)
        except NotLeader:
            return None
        except TargetNotFound as exc:
            self._block("TargetNotFound", str(exc))
            return None
        except ScaleError as exc:  # the Scale could not be read
            self._block("FailedGetScale", str(exc))
            return None
        if self.blocked is not None:
            self.events.emit(object_ref(obj), "Normal", "TargetReady", f"acting on {self.target.name} again")
            self.blocked = None
        self._write(obj, step)
        return step

    def retry(self) -> bool:
        ok = super().retry()
        if ok:
            self._write(self.current(), None)
        return ok

    def _write(self, obj: dict, step: Step | None) -> None:
        obs, target = self.last_obs, self.target
        stamp = now_rfc3339()

        def mutate(status: dict) -> None:
            if step is not None:
                updates = step_conditions(obs, step, self.policy.min_replicas, self.policy.max_replicas,
                                          target.name)
                status["conditions"] = merge_conditions(status.get("conditions"), updates, stamp)
                status["currentReplicas"] = obs.current_replicas
                status["readyReplicas"] = obs.ready
                status["desiredReplicas"] = step.desired
                status["policyState"] = {"time": obs.time, "policy": self.policy.state_dict(),
                                         "desired": step.desired}
            else:  # a retried scale went through
                status["conditions"] = merge_conditions(status.get("conditions"), {"AbleToScale": (
                    True, "SucceededRescale", f"{target.name} at {self.last_step.desired} replicas")}, stamp)
            if target.last_scale_time:
                status["lastScaleTime"] = target.last_scale_time
            status["observedGeneration"] = obj["metadata"].get("generation", 0)

        self._store(obj, mutate)

    def _store(self, obj: dict, mutate) -> None:
        try:
            stored = self.status.write(obj, mutate)
        except Exception as exc:  # the next tick writes again
            log.warning("%s: status write failed: %s", self.name, exc)
            return
        if stored is not None:
            self._written = (obj["metadata"].get("resourceVersion"), stored)
            self.obj = stored

    def _block(self, reason: str, message: str) -> None:
        obj = self.current()
        if self.blocked != (reason, message):
            log.warning("%s: %s: %s", self.name, reason, message)
            self.events.emit(object_ref(obj), "Warning", reason, message)
            self.blocked = (reason, message)
        stamp = now_rfc3339()

        def mutate(status: dict) -> None:
            status["conditions"] = merge_conditions(status.get("conditions"), blocked_conditions(reason,
                                                                                                 message),
                                                    stamp)
            status["observedGeneration"] = obj["metadata"].get("generation", 0)

        self._store(obj, mutate)

    def _event_scaled(self, old: int, new: int, reason: str) -> None:
        self.events.emit(object_ref(self.current()), "Normal", "SuccessfulRescale",
                         f"New size: {new} (was {old}); reason: {reason}")

    def _event_scale_failed(self, desired: int, message: str) -> None:
        self.events.emit(object_ref(self.current()), "Warning", "FailedRescale", message)


