"""A Target on the scale subresource of any kind that has one (Deployment, StatefulSet,
LeaderWorkerSet, custom resources).

    current, ready = target.replicas()   # the Scale's spec.replicas; ready from the target's status
    target.scale(5, reason)              # PUT of the Scale with the resourceVersion it was read at

Optimistic concurrency as every Kubernetes controller does it: a write carries the resourceVersion it
read; a 409 Conflict means someone wrote in between, so the Scale is read afresh and the write tried
again. A target that does not exist raises TargetNotFound (a ScaleError), so the loop reports it and
goes on. Ready replicas come from the target's `status.readyReplicas` (workloads and most scalable
custom resources have it), else the Scale's status.replicas.
"""

from __future__ import annotations

from datetime import datetime, timezone

from kubernetes import client

from controlplane.kube.client import TIMEOUT, ApiException
from controlplane.kube.kinds import Resource
from controlplane.targets.base import Replicas, ScaleError, Target

CONFLICT_RETRIES = 5


class TargetNotFound(ScaleError):
    """The scale target does not exist (deleted, or not created yet)."""


class NotLeader(ScaleError):
    """This controller does not hold the lease: it writes nothing."""


class KubeScaleTarget(Target):
    def __init__(self, api: client.CustomObjectsApi, res: Resource, namespace: str, name: str,
                 may_write=lambda: True, on_scaled=None, on_failed=None):
        self.api, self.res, self.namespace, self.target = api, res, namespace, name
        self.name = f"{res.kind}/{name}"
        self.may_write = may_write
        self.on_scaled = on_scaled  # (old, new, reason) after a write went through
        self.on_failed = on_failed  # (desired, message) after a write failed
        self.selector: str | None = None  # the Scale's status.selector, for pod discovery
        self.last_scale_time: str | None = None
        self.conflicts = 0  # 409s met (and retried)
        self._scale: dict | None = None  # the Scale as last read
        self._last = Replicas(0, 0)

    def _call(self, fn, *args):
        r = self.res
        try:
            return fn(r.group, r.version, self.namespace, r.plural, self.target, *args,
                      _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise TargetNotFound(f"{r.kind} {self.namespace}/{self.target} not found") from None
            raise

    def read_scale(self) -> dict:
        try:
            scale = self._call(self.api.get_namespaced_custom_object_scale)
        except ApiException as exc:
            raise ScaleError(f"reading the scale of {self.name}: {exc.status} {exc.reason}") from None
        except OSError as exc:
            raise ScaleError(f"reading the scale of {self.name}: {exc}") from None
        self._scale = scale
        self.selector = (scale.get("status") or {}).get("selector") or None
        return scale

    def replicas(self) -> Replicas:
        scale = self.read_scale()
        current = int((scale.get("spec") or {}).get("replicas") or 0)
        ready = None
        try:
            obj = self._call(self.api.get_namespaced_custom_object)
            ready = (obj.get("status") or {}).get("readyReplicas")
        except (ApiException, OSError):
            pass
        if ready is None:
            ready = (scale.get("status") or {}).get("replicas") or 0
        self._last = Replicas(current, int(ready))
        return self._last

    def starting(self) -> int:
        """Replicas asked for and not ready yet (pods starting), as of the last replicas()."""
        return max(0, self._last.current - self._last.ready)

    def scale(self, desired: int, reason: str) -> None:
        scale = self._scale or self.read_scale()
        for _ in range(CONFLICT_RETRIES):
            old = int((scale.get("spec") or {}).get("replicas") or 0)
            if old == desired:
                return
            if not self.may_write():
                raise NotLeader(f"not the leader: {self.name} stays at {old}")
            body = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                    "metadata": {"name": self.target, "namespace": self.namespace,
                                 "resourceVersion": scale["metadata"]["resourceVersion"]},
                    "spec": {"replicas": int(desired)}}
            try:
                self._scale = self._call(self.api.replace_namespaced_custom_object_scale, body)
            except ApiException as exc:
                if exc.status == 409:  # written by someone else since we read it: read again, retry
                    self.conflicts += 1
                    scale = self.read_scale()
                    continue
                self._failed(desired, f"{exc.status} {exc.reason}")
            except OSError as exc:
                self._failed(desired, str(exc))
            except TargetNotFound as exc:
                self._failed(desired, str(exc), exc)
            self.last_scale_time = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if self.on_scaled is not None:
                self.on_scaled(old, desired, reason)
            return
        self._failed(desired, f"still conflicting after {CONFLICT_RETRIES} fresh reads")

    def _failed(self, desired: int, message: str, exc: ScaleError | None = None):
        self._scale = None  # read afresh next time
        text = f"scaling {self.name} to {desired}: {message}"
        if self.on_failed is not None:
            self.on_failed(desired, text)
        if exc is not None:
            raise type(exc)(text) from None
        raise ScaleError(text)
