"""Conflicts and broken targets: a 409 injected on every first write is retried on a fresh read and
applied; a deleted target gives a condition and the loop goes on; a target owned by an HPA, a KEDA
ScaledObject or an older InferenceAutoscaler is refused with a condition and an Event, never scaled."""

from __future__ import annotations

from tests.kube.apiserver.errors import conflict
from tests.kube.helpers import deployment, keda_crd, queue_autoscaler, scaled_object, set_ready, wait_for


def first_write_conflicts(cluster, resources: set[tuple[str, str]]):
    """A fault: the first attempt of every update of these (resource, subresource) gets a 409; the retry
    that follows goes through. Returns the list of conflicts it answered."""
    answered, armed = [], set()

    def fault(info):
        key = (info.resource, info.subresource, info.namespace, info.name)
        if info.verb != "update" or (info.resource, info.subresource) not in resources:
            return None
        if key in armed:
            armed.discard(key)
            return None
        armed.add(key)
        answered.append(key)
        return conflict(cluster.store.types[(info.group, info.resource)], info.name)

    cluster.api.faults.append(fault)
    return answered


def setup(cluster, metrics_page, ns: str, waiting: float):
    cluster.namespace(ns)
    cluster.apply(deployment("llama"), ns)
    set_ready(cluster, ns, "llama", 1)
    page = metrics_page(waiting)
    page.pod(cluster, ns, "llama-0", {"app": "llama"})
    return page


def test_a_conflict_on_every_first_write_is_retried_and_applied(cluster, metrics_page):
    setup(cluster, metrics_page, "t", waiting=6)  # queue 6, threshold 2: 3 replicas
    answered = first_write_conflicts(cluster, {("deployments", "scale"), ("inferenceautoscalers", "status")})
    cluster.apply(queue_autoscaler("llama", "llama"), "t")
    ctl = cluster.controller(namespace="t", leader_election=False)
    wait_for(lambda: cluster.get("apps/v1", "Deployment", "t", "llama")["spec"]["replicas"] == 3, 20,
             "scale to 3 through the conflicts")
    ias = wait_for(lambda: (lambda o: o if (o.get("status") or {}).get("desiredReplicas") == 3 else None)(
        cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", "t", "llama")), 20, "status written")
    cluster.stop_controller(ctl)

    writes = [(e["resource"], e["subresource"], e["code"]) for e in cluster.controller_requests()
              if e["verb"] == "update"]
    print("controller writes (resource, subresource, code):", writes)
    scale_writes = [c for r, s, c in writes if (r, s) == ("deployments", "scale")]
    status_writes = [c for r, s, c in writes if (r, s) == ("inferenceautoscalers", "status")]
    assert scale_writes[:2] == [409, 200]  # refused, then applied after a fresh read
    assert status_writes.count(409) >= 1 and 200 in status_writes
    assert ("deployments", "scale", "t", "llama") in answered
    # each conflict is followed by a fresh GET of what was refused before the retry
    reqs = [(e["verb"], e["resource"], e["subresource"], e["code"]) for e in cluster.controller_requests()]
    i = reqs.index(("update", "deployments", "scale", 409))
    assert reqs[i + 1] == ("get", "deployments", "scale", 200)
    assert ("update", "deployments", "scale", 200) in reqs[i + 2:]
    i = reqs.index(("update", "inferenceautoscalers", "status", 409))
    assert reqs[i + 1:i + 3] == [("get", "inferenceautoscalers", "", 200),
                                 ("update", "inferenceautoscalers", "status", 200)]
    st = ias["status"]
    assert st["currentReplicas"] == 1 or st["currentReplicas"] == 3
    assert {c["type"]: c["status"] for c in st["conditions"]}["AbleToScale"] == "True"
    assert "policyState" in st and st["lastScaleTime"]
    reasons = [e["reason"] for e in cluster.events("t", "llama")]
    assert "SuccessfulRescale" in reasons and "FailedRescale" not in reasons


def test_a_deleted_target_sets_a_condition_and_the_loop_goes_on(cluster, metrics_page):
    setup(cluster, metrics_page, "t", waiting=4)  # 2 replicas
    cluster.apply(queue_autoscaler("llama", "llama"), "t")
    ctl = cluster.controller(namespace="t", leader_election=False)
    wait_for(lambda: cluster.get("apps/v1", "Deployment", "t", "llama")["spec"]["replicas"] == 2, 20,
             "scale to 2")

    cluster.delete("apps/v1", "Deployment", "t", "llama")
    gone = wait_for(lambda: (lambda c: c if c and c["reason"] == "TargetNotFound" else None)(
        cluster.condition("t", "llama", "Ready")), 20, "TargetNotFound condition")
    assert gone["status"] == "False" and "llama" in gone["message"]
    assert cluster.condition("t", "llama", "AbleToScale")["status"] == "False"
    assert any(e["reason"] == "TargetNotFound" and e["type"] == "Warning" for e in cluster.events("t",
                                                                                                  "llama"))
    assert ctl.thread.is_alive()

    # the target comes back: the same loop acts on it again
    cluster.apply(deployment("llama"), "t")
    set_ready(cluster, "t", "llama", 1)
    wait_for(lambda: cluster.get("apps/v1", "Deployment", "t", "llama")["spec"]["replicas"] == 2, 20,
             "scaled again after the target came back")
    wait_for(lambda: cluster.condition("t", "llama", "Ready")["status"] == "True", 20, "Ready again")
    cluster.stop_controller(ctl)
    assert any(e["reason"] == "TargetReady" for e in cluster.events("t", "llama"))


HPA = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "llama-hpa"},
       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                "minReplicas": 1, "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                    "type": "Utilization", "averageUtilization": 80}}}]}}


def test_targets_owned_by_others_are_refused(cluster, metrics_page):
    page = setup(cluster, metrics_page, "t", waiting=8)  # it would scale to 4 if it acted
    cluster.apply(keda_crd())
    for name in ("other", "third"):
        cluster.apply(deployment(name), "t")
    page.pod(cluster, "t", "third-0", {"app": "third"})
    cluster.apply(HPA, "t")
    cluster.apply(scaled_object("other-so", "other"), "t")  # KEDA's: not handed to us
    cluster.apply(queue_autoscaler("by-hpa", "llama"), "t")
    cluster.apply(queue_autoscaler("by-keda", "other"), "t")
    cluster.apply(queue_autoscaler("first", "third"), "t")
    cluster.apply(queue_autoscaler("second", "third"), "t")  # younger (same second: then by name)
    ctl = cluster.controller(namespace="t", leader_election=False)

    def reason(name):
        c = cluster.condition("t", name, "Ready")
        return c["reason"] if c else None

    wanted = {"by-hpa": "TargetOwnedByHPA", "by-keda": "TargetOwnedByScaledObject",
              "second": "TargetOwnedByInferenceAutoscaler"}
    wait_for(lambda: all(reason(n) == r for n, r in wanted.items()), 20, "refusals")
    wait_for(lambda: cluster.get("apps/v1", "Deployment", "t", "third")["spec"]["replicas"] > 1, 20,
             "the oldest autoscaler of 'third' acts")
    cluster.stop_controller(ctl)
    for name, target, owner in (("by-hpa", "llama", "HorizontalPodAutoscaler llama-hpa"),
                                ("by-keda", "other", "KEDA ScaledObject other-so"),
                                ("second", "third", "InferenceAutoscaler first")):
        cond = cluster.condition("t", name, "Ready")
        assert cond["status"] == "False" and owner in cond["message"], cond
        assert cluster.condition("t", name, "AbleToScale")["status"] == "False"
        events = [e for e in cluster.events("t", name) if e["type"] == "Warning"]
        assert len(events) == 1 and events[0]["reason"] == cond["reason"]  # once, not every tick
    # never acted on: no scale read or write of the refused targets' Deployments
    assert cluster.get("apps/v1", "Deployment", "t", "llama")["spec"]["replicas"] == 1
    assert cluster.get("apps/v1", "Deployment", "t", "other")["spec"]["replicas"] == 1
    touched = {e["name"] for e in cluster.controller_requests() if e["resource"] == "deployments"}
    assert touched == {"third"}
