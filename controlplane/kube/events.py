"""Kubernetes Events about an autoscaler (core/v1, as the HPA controller records them): one per scale
and per failure, visible in `kubectl describe` and `kubectl get events`. Best effort: a failed
Event write is logged, never raised."""

from __future__ import annotations

import logging
import socket
from datetime import datetime, timezone

from kubernetes import client

from controlplane.kube.client import TIMEOUT, ApiException

log = logging.getLogger("slopilot.kube")
COMPONENT = "slopilot-controller"


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_ref(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace"), "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion")}


class EventRecorder:
    def __init__(self, core: client.CoreV1Api, identity: str = "", may_write=lambda: True):
        self.core, self.identity, self.may_write = core, identity, may_write
        self.host = socket.gethostname()
        self.sent: list[tuple[str, str, str]] = []  # (type, reason, message), newest last

    def emit(self, ref: dict, type_: str, reason: str, message: str) -> None:
        """type_: Normal or Warning; reason: CamelCase, e.g. SuccessfulRescale."""
        if not self.may_write():
            return
        now = now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{ref['name']}.", "namespace": ref["namespace"]},
                "involvedObject": ref, "type": type_, "reason": reason, "message": message[:1024],
                "source": {"component": COMPONENT, "host": self.host}, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "reportingComponent": COMPONENT, "reportingInstance": self.identity or self.host}
        try:
            self.core.create_namespaced_event(ref["namespace"], body, _request_timeout=TIMEOUT)
            self.sent.append((type_, reason, message))
            del self.sent[:-100]
        except (ApiException, OSError) as exc:
            log.warning("%s/%s: could not record event %s: %s", ref["namespace"], ref["name"], reason, exc)
