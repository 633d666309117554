"""Scale targets of every kind with a scale subresource (StatefulSet, LeaderWorkerSet, a custom
resource found through discovery), and KEDA ScaledObjects run only when handed to us (annotation or
--scaled-objects), with their status written like an InferenceAutoscaler's."""

from __future__ import annotations

from tests.kube.apiserver.errors import conflict
from tests.kube.helpers import deployment, keda_crd, queue_autoscaler, scaled_object, set_ready, wait_for

LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
POOL = ("inference.example.com", "v1", "servingpools", "ServingPool")  # a kind no table knows


def scalable_crd(group: str, version: str, plural: str, kind: str) -> dict:
    """A CRD with a scale subresource whose selector is in .status.hpaPodSelector (as LWS's)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                               "singular": kind.lower()},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "subresources": {"status": {}, "scale": {
                                       "specReplicasPath": ".spec.replicas",
                                       "statusReplicasPath": ".status.replicas",
                                       "labelSelectorPath": ".status.hpaPodSelector"}},
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                       "spec": {"type": "object", "properties": {
                                           "replicas": {"type": "integer", "minimum": 0, "default": 1}}},
                                       "status": {"type": "object",
                                                  "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def custom_target(cluster, ns: str, spec: tuple, name: str, ready: int) -> None:
    group, version, plural, kind = spec
    cluster.apply({"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": name},
                   "spec": {"replicas": 1}}, ns)
    t = cluster.store.types[(group, plural)]
    obj = cluster.store.get(t, ns, name)
    obj["status"] = {"replicas": 1, "readyReplicas": ready, "hpaPodSelector": f"app={name}"}
    cluster.store.update(t, ns, name, obj, "status")


def test_statefulsets_leaderworkersets_and_discovered_kinds_are_scaled(cluster, metrics_page):
    ns = cluster.namespace("t")
    sts = {**deployment("db"), "kind": "StatefulSet"}
    sts["spec"]["serviceName"] = "db"
    cluster.apply(sts, ns)
    set_ready(cluster, ns, "db", 1, "statefulsets")
    cluster.apply(scalable_crd(*LWS))
    cluster.apply(scalable_crd(*POOL))
    custom_target(cluster, ns, LWS, "lws", ready=1)
    custom_target(cluster, ns, POOL, "pool", ready=1)
    # our ClusterRole lists the kinds it scales; a new kind is granted the same way
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "scale-servingpools"},
                   "rules": [{"apiGroups": [POOL[0]], "resources": ["servingpools/scale"], "verbs": ["get",
                                                                                                     "update"]},
                             {"apiGroups": [POOL[0]], "resources": ["servingpools"], "verbs": ["get"]}]})
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "scale-servingpools"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "scale-servingpools"},
                   "subjects": [{"kind": "ServiceAccount", "name": "slopilot-controller",
                                 "namespace": "slopilot-system"}]})
    page = metrics_page(6)  # 3 replicas each
    for name in ("db", "lws", "pool"):
        page.pod(cluster, ns, f"{name}-0", {"app": name})
    cluster.apply(queue_autoscaler("db", "db", kind="StatefulSet"), ns)
    cluster.apply(queue_autoscaler("lws", "lws", kind=LWS[3], api_version=f"{LWS[0]}/{LWS[1]}"), ns)
    cluster.apply(queue_autoscaler("pool", "pool", kind=POOL[3], api_version=f"{POOL[0]}/{POOL[1]}"), ns)
    ctl = cluster.controller(namespace=ns, leader_election=False)
    for api_version, kind, name in (("apps/v1", "StatefulSet", "db"), (f"{LWS[0]}/{LWS[1]}", LWS[3], "lws"),
                                    (f"{POOL[0]}/{POOL[1]}", POOL[3], "pool")):
        obj = (api_version, kind, ns, name)
        wait_for(lambda: cluster.get(*obj)["spec"]["replicas"] == 3, 20, f"{kind} scaled")
    wait_for(lambda: all((cluster.condition(ns, n, "AbleToScale") or {}).get("status") == "True"
                         for n in ("db", "lws", "pool")), 10, "statuses")
    cluster.stop_controller(ctl)
    used = {(e["verb"], e["resource"], e["subresource"]) for e in cluster.controller_requests()}
    for plural in ("statefulsets", "leaderworkersets", "servingpools"):
        assert {("get", plural, "scale"), ("update", plural, "scale"), ("get", plural, "")} <= used
    # the pods behind each target were found through its Scale's selector
    ia = cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", ns, "lws")
    assert ia["status"]["readyReplicas"] == 1  # the LeaderWorkerSet's status.readyReplicas


def test_scaled_objects_only_when_handed_to_us(cluster, metrics_page):
    ns = cluster.namespace("t")
    cluster.apply(keda_crd())
    for name in ("mine", "keda"):
        cluster.apply(deployment(name), ns)
        set_ready(cluster, ns, name, 1)
    page = metrics_page(6)
    page.pod(cluster, ns, "mine-0", {"app": "mine"})
    page.pod(cluster, ns, "keda-0", {"app": "keda"})
    cluster.apply(scaled_object("mine", "mine", {"slopilot.dev/managed": "true"}), ns)
    cluster.apply(scaled_object("keda", "keda"), ns)  # KEDA's own: never touched
    refused = []

    def first_status_conflict(info):
        if (info.verb, info.resource, info.subresource) == ("update", "scaledobjects",
                                                            "status") and not refused:
            refused.append(info.name)
            return conflict(cluster.store.types[("keda.sh", "scaledobjects")], info.name)
        return None

    cluster.api.faults.append(first_status_conflict)
    ctl = cluster.controller(namespace=ns, leader_election=False)
    wait_for(lambda: cluster.get("apps/v1", "Deployment", ns, "mine")["spec"]["replicas"] == 3, 20,
             "mine scaled")
    so = wait_for(lambda: (lambda o: o if (o.get("status") or {}).get("desiredReplicas") == 3 else None)(
        cluster.get("keda.sh/v1alpha1", "ScaledObject", ns, "mine")), 20, "its status")
    cluster.stop_controller(ctl)
    assert {c["type"] for c in so["status"]["conditions"]} >= {"Ready", "Active", "Fallback"}
    assert refused == ["mine"]
    assert cluster.get("apps/v1", "Deployment", ns, "keda")["spec"]["replicas"] == 1
    assert "status" not in cluster.get("keda.sh/v1alpha1", "ScaledObject", ns, "keda")
    assert not cluster.events(ns, "keda")

    # --scaled-objects: every ScaledObject is ours (no KEDA in this cluster)
    ctl = cluster.controller(namespace=ns, leader_election=False, scaled_objects=True)
    wait_for(lambda: cluster.get("apps/v1", "Deployment", ns, "keda")["spec"]["replicas"] == 3, 20,
             "all of them")
    cluster.stop_controller(ctl)
