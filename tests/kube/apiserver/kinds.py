"""The resource types the stand-in serves: built-in ones, and those that CRDs register at run time.

A type knows its group/version, plural, kind, scope, and its subresources: `status` (writes to the
main resource keep the stored status; writes to /status keep everything else) and `scale` (the paths
of the replica counts and the label selector, as a CRD's `subresources.scale` states them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
WORKLOAD_SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                  "labelSelectorPath": None}  # None: derived from .spec.selector, as for apps/v1


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    status: bool = False
    scale: dict | None = None
    schema: dict | None = None  # a CRD's openAPIV3Schema: validates, defaults and prunes
    columns: list[dict] = field(default_factory=list)  # a CRD's additionalPrinterColumns
    crd: str | None = None  # the CRD that registered it
    generation: bool = True  # metadata.generation follows spec changes

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return self.group, self.plural

    def __post_init__(self) -> None:
        self.singular = self.singular or self.kind.lower()


def _t(group, version, plural, kind, namespaced=True, short=(), status=False, scale=None, generation=True):
    return ResourceType(group, version, plural, kind, namespaced, short_names=list(short), status=status,
                        scale=scale, generation=generation)


BUILTIN = [
    _t("", "v1", "namespaces", "Namespace", False, ["ns"], status=True, generation=False),
    _t("", "v1", "pods", "Pod", short=["po"], status=True),
    _t("", "v1", "services", "Service", short=["svc"], status=True, generation=False),
    _t("", "v1", "serviceaccounts", "ServiceAccount", short=["sa"], generation=False),
    _t("", "v1", "configmaps", "ConfigMap", short=["cm"], generation=False),
    _t("", "v1", "secrets", "Secret", generation=False),
    _t("", "v1", "events", "Event", short=["ev"], generation=False),
    _t("apps", "v1", "deployments", "Deployment", short=["deploy"], status=True, scale=WORKLOAD_SCALE),
    _t("apps", "v1", "statefulsets", "StatefulSet", short=["sts"], status=True, scale=WORKLOAD_SCALE),
    _t("coordination.k8s.io", "v1", "leases", "Lease", generation=False),
    _t("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", generation=False),
    _t("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", short=["hpa"],
       status=True),
    _t("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=["pdb"], status=True),
    _t("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, generation=False),
    _t("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False,
       generation=False),
    _t("rbac.authorization.k8s.io", "v1", "roles", "Role", generation=False),
    _t("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", generation=False),
    _t("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
       ["crd", "crds"], status=True),
]


def resource_list(types: list[ResourceType], group_version: str) -> dict:
    """The APIResourceList of one group/version (legacy discovery), subresources included."""
    out = []
    for t in types:
        if t.group_version != group_version:
            continue
        out.append({"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
                    "verbs": VERBS, "shortNames": t.short_names} if t.short_names else
                   {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
                    "verbs": VERBS})
        if t.crd:
            out[-1]["categories"] = ["all"]
        if t.status:
            out.append({"name": f"{t.plural}/status", "singularName": "", "namespaced": t.namespaced,
                        "kind": t.kind, "verbs": ["get", "patch", "update"]})
        if t.scale:
            out.append({"name": f"{t.plural}/scale", "singularName": "", "namespaced": t.namespaced,
                        "group": "autoscaling", "version": "v1", "kind": "Scale",
                        "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": out}


def group_list(types: list[ResourceType]) -> dict:
    groups: dict[str, list[str]] = {}
    for t in types:
        if t.group:
            versions = groups.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
    items = []
    for name, versions in groups.items():
        vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        items.append({"name": name, "versions": vs, "preferredVersion": vs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": items}
