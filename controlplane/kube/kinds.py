"""Where a scale target lives in the API: scaleTargetRef's apiVersion and kind -> group, version, plural.

Known kinds come from a table; any other kind (a custom resource with a scale subresource) is looked
up once in the API server's discovery document of its group/version, which also says whether the
kind has a `scale` subresource at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from controlplane.kube.client import get_json

DEFAULT_API_VERSION, DEFAULT_KIND = "apps/v1", "Deployment"  # scaleTargetRef's defaults (as KEDA's)
KNOWN = {
    ("apps", "Deployment"): ("v1", "deployments"),
    ("apps", "StatefulSet"): ("v1", "statefulsets"),
    ("apps", "ReplicaSet"): ("v1", "replicasets"),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): ("v1", "leaderworkersets"),
}


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def target_ref(spec_doc: dict) -> tuple[str, str, str]:
    """(apiVersion, kind, name) of a spec's scaleTargetRef, with the defaults filled."""
    ref = (spec_doc.get("spec") or {}).get("scaleTargetRef") or {}
    return ref.get("apiVersion") or DEFAULT_API_VERSION, ref.get("kind") or DEFAULT_KIND, ref.get("name", "")


class Resolver:
    """apiVersion + kind -> Resource, from the table or discovery (cached)."""

    def __init__(self, api_client):
        self.api_client = api_client
        self._cache: dict[tuple[str, str], Resource] = {}
        self._lock = threading.Lock()

    def resolve(self, api_version: str, kind: str) -> Resource:
        group, _, version = api_version.rpartition("/")
        if not group:
            raise ValueError(f"scaleTargetRef: {kind} in the core API group has no scale subresource "
                             f"that slopilot scales (give an apps/v1 or custom resource kind)")
        known = KNOWN.get((group, kind))
        if known is not None and known[0] == version:
            return Resource(group, version, known[1], kind)
        with self._lock:
            hit = self._cache.get((api_version, kind))
        if hit is not None:
            return hit
        doc = get_json(self.api_client, f"/apis/{group}/{version}")
        names = {r.get("name", ""): r for r in (doc or {}).get("resources", [])}
        plural = next((n for n, r in names.items() if r.get("kind") == kind and "/" not in n), None)
        if plural is None:
            raise ValueError(f"scaleTargetRef: the API server serves no kind {kind} in {api_version}")
        if f"{plural}/scale" not in names:
            raise ValueError(f"scaleTargetRef: {kind} ({api_version}) has no scale subresource")
        res = Resource(group, version, plural, kind)
        with self._lock:
            self._cache[(api_version, kind)] = res
        return res
