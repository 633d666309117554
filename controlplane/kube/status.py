"""An autoscaler's status: its conditions (pure functions, table-tested) and the write of the status
subresource (optimistic concurrency: a 409 means a fresh read and another try).

    status:
      currentReplicas: 3         # the target's spec.replicas when last reconciled
      readyReplicas: 2
      desiredReplicas: 4         # what the last decision asked for, clamped
      lastScaleTime: ...         # when the controller last changed the replica count
      observedGeneration: 2
      conditions: [Ready, Active, Fallback, ScalingLimited, AbleToScale]
      policyState: {...}         # what the policy remembers (stabilization, events, fallback counter)

A restarted or failed-over controller loads policyState and resumes without flapping.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone

from kubernetes import client

from controlplane.kube.client import TIMEOUT, ApiException
from controlplane.kube.kinds import Resource

ORDER = ("Ready", "Active", "Fallback", "ScalingLimited", "AbleToScale")
CONFLICT_RETRIES = 5


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(previous: list[dict] | None, updates: dict[str, tuple[bool, str, str]],
                     now: str) -> list[dict]:
    """previous conditions with `updates` (type -> (status, reason, message)) applied; a condition
    keeps its lastTransitionTime unless its status flips; the order is ORDER's."""
    by_type = {c.get("type"): dict(c) for c in previous or []}
    for type_, (status, reason, message) in updates.items():
        text = "True" if status else "False"
        old = by_type.get(type_)
        changed = old is None or old.get("status") != text
        by_type[type_] = {"type": type_, "status": text, "reason": reason, "message": message,
                          "lastTransitionTime": now if changed else old.get("lastTransitionTime", now)}
    return [by_type[t] for t in ORDER if t in by_type] + [c for t, c in by_type.items() if t not in ORDER]


def step_conditions(obs, step, min_replicas: int, max_replicas: int, target: str) -> dict:
    """The conditions one reconcile step sets (obs: Observation, step: autoscaler.reconcile.Step)."""
    d = step.decision
    out = {"Ready": (True, "Reconciled", f"reconciling {target}")}
    out["Active"] = (bool(d.active), "ScalerActive" if d.active else "ScalerNotActive", d.reason)
    if obs.errors:
        out["Fallback"] = (True, "MetricsUnavailable",
                           f"failed metrics: {', '.join(sorted(obs.errors))}; {d.reason}")
    else:
        out["Fallback"] = (False, "MetricsAvailable", "every metric was read")
    wanted = d.desired_replicas
    if wanted > max_replicas:
        out["ScalingLimited"] = (True, "TooManyReplicas", f"the policy asked for {wanted}, above maxReplicas "
                                                          f"{max_replicas}")
    elif wanted < min_replicas:
        out["ScalingLimited"] = (True, "TooFewReplicas", f"the policy asked for {wanted}, below minReplicas "
                                                         f"{min_replicas}")
    else:
        out["ScalingLimited"] = (False, "DesiredWithinRange", f"the desired count {wanted} is within "
                                                              f"[{min_replicas}, {max_replicas}]")
    if step.error:
        out["AbleToScale"] = (False, "FailedUpdateScale", step.error)
    else:
        out["AbleToScale"] = (True, "SucceededRescale" if step.desired != obs.current_replicas
                              else "ReadyForNewScale", f"{target} at {step.desired} replicas")
    return out


def blocked_conditions(reason: str, message: str) -> dict:
    """The conditions of an autoscaler that cannot act (target missing or owned, invalid spec)."""
    return {"Ready": (False, reason, message), "AbleToScale": (False, reason, message)}


class StatusWriter:
    """Writes the status subresource of one resource type (InferenceAutoscaler or ScaledObject)."""

    def __init__(self, api: client.CustomObjectsApi, res: Resource, may_write=lambda: True):
        self.api, self.res, self.may_write = api, res, may_write
        self.conflicts = 0

    def write(self, obj: dict, mutate) -> dict | None:
        """Applies `mutate(status)` to `obj`'s status (obj: the cached object, read afresh on a
        conflict) and writes it when it changed; the stored object, or None (deleted, not leader)."""
        r = self.res
        ns, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        for _ in range(CONFLICT_RETRIES):
            if not self.may_write():
                return None
            status = copy.deepcopy(obj.get("status") or {})
            mutate(status)
            if status == (obj.get("status") or {}):
                return obj
            body = {**obj, "status": status}
            try:
                return self.api.replace_namespaced_custom_object_status(r.group, r.version, ns, r.plural,
                                                                        name, body,
                                                                        _request_timeout=TIMEOUT)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                if exc.status != 409:
                    raise
                self.conflicts += 1
                obj = self.api.get_namespaced_custom_object(r.group, r.version, ns, r.plural, name,
                                                            _request_timeout=TIMEOUT)
        raise RuntimeError(f"{r.kind} {ns}/{name}: status still conflicting after {CONFLICT_RETRIES} reads")
