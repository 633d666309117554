"""The pure parts of kube mode, table-tested: conditions from a reconcile step, the merge that keeps
transition times, who owns a target, leader election on a fake Lease API and clock, the scale
target's conflict handling on a fake API, and the stand-in's selectors."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from autoscaler.observation import Observation
from autoscaler.policy import Decision
from autoscaler.reconcile import Step
from controlplane.kube.kinds import Resource
from controlplane.kube.leader import LeaderElector
from controlplane.kube.ownership import owner_conflict
from controlplane.kube.scale import KubeScaleTarget, NotLeader, TargetNotFound
from controlplane.kube.status import merge_conditions, step_conditions
from tests.kube.apiserver.selectors import match_labels, parse_labels, selector_string


@pytest.mark.parametrize("errors, wanted, desired, error, expect", [
    (set(), 3, 3, None, {"Fallback": ("False", "MetricsAvailable"), "ScalingLimited": ("False",
                                                                                       "DesiredWithinRange"),
                         "AbleToScale": ("True", "SucceededRescale"), "Active": ("True", "ScalerActive")}),
    ({"queue"}, 2, 2, None, {"Fallback": ("True", "MetricsUnavailable"), "AbleToScale": ("True",
                                                                                         "ReadyForNewScale")}),
    (set(), 12, 10, None, {"ScalingLimited": ("True", "TooManyReplicas")}),
    (set(), 0, 1, None, {"ScalingLimited": ("True", "TooFewReplicas")}),
    (set(), 4, 4, "409 Conflict", {"AbleToScale": ("False", "FailedUpdateScale")}),
])
def test_step_conditions(errors, wanted, desired, error, expect):
    obs = Observation(0.0, 2, 2, errors=errors)
    step = Step(Decision(wanted, wanted > 0, "hpa: x"), desired, error)
    got = {k: ("True" if v[0] else "False", v[1]) for k, v in step_conditions(obs, step, 1, 10,
                                                                              "Deployment/x").items()}
    assert got["Ready"] == ("True", "Reconciled")
    for k, v in expect.items():
        assert got[k] == v, k


def test_merge_keeps_transition_times_unless_the_status_flips():
    first = merge_conditions(None, {"Ready": (True, "A", "a"), "Active": (False, "B", "b")}, "t1")
    assert [c["type"] for c in first] == ["Ready", "Active"]
    second = merge_conditions(first, {"Ready": (True, "A2", "a2"), "Active": (True, "B2", "b2")}, "t2")
    by = {c["type"]: c for c in second}
    assert by["Ready"]["lastTransitionTime"] == "t1" and by["Ready"]["reason"] == "A2"
    assert by["Active"]["lastTransitionTime"] == "t2" and by["Active"]["status"] == "True"


def ia(name, target, created="2024-01-01T00:00:00Z", ns="t", kind="InferenceAutoscaler"):
    return {"kind": kind, "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": {"scaleTargetRef": {"name": target}}}


def hpa(name, target, ns="t", owner=None):
    meta = {"name": name, "namespace": ns}
    if owner:
        meta["ownerReferences"] = [{"kind": "ScaledObject", "name": owner}]
    return {"metadata": meta, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                          "name": target}}}


@pytest.mark.parametrize("hpas, sos, ours, me, reason", [
    ([], [], ["a"], "a", None),
    ([hpa("h", "x")], [], ["a"], "a", "TargetOwnedByHPA"),
    ([hpa("h", "x", ns="other")], [], ["a"], "a", None),  # another namespace's HPA
    ([hpa("h", "y")], [], ["a"], "a", None),  # another target
    ([hpa("keda-hpa-s", "x", owner="s")], [], ["a"], "a", "TargetOwnedByHPA"),
    ([], [ia("s", "x", kind="ScaledObject")], ["a"], "a", "TargetOwnedByScaledObject"),
    ([], [], ["a", "b"], "b", "TargetOwnedByInferenceAutoscaler"),  # same age: by name
    ([], [], ["a", "b"], "a", None),
])
def test_owner_conflict(hpas, sos, ours, me, reason):
    objs = {n: ia(n, "x") for n in ours}
    got = owner_conflict(objs[me], hpas, sos, list(objs.values()))
    assert (got[0] if got else None) == reason


def test_an_older_autoscaler_keeps_the_target():
    old, young = ia("zz", "x", "2024-01-01T00:00:00Z"), ia("aa", "x", "2024-06-01T00:00:00Z")
    assert owner_conflict(old, [], [], [old, young]) is None
    assert owner_conflict(young, [], [], [old, young])[0] == "TargetOwnedByInferenceAutoscaler"


class FakeLeases:
    """CoordinationV1Api's lease calls on one in-memory Lease with resourceVersions."""

    def __init__(self):
        self.lease, self.rv, self.fail = None, 0, False

    def _check(self):
        if self.fail:
            raise ApiException(status=503, reason="unavailable")

    def read_namespaced_lease(self, name, ns, **kw):
        self._check()
        if self.lease is None:
            raise ApiException(status=404, reason="NotFound")
        return client.V1Lease(metadata=client.V1ObjectMeta(name=name, resource_version=str(self.rv)),
                              spec=self.lease)

    def create_namespaced_lease(self, ns, body, **kw):
        self._check()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.lease, self.rv = body.spec, self.rv + 1

    def replace_namespaced_lease(self, name, ns, body, **kw):
        self._check()
        if body.metadata.resource_version != str(self.rv):
            raise ApiException(status=409, reason="Conflict")
        self.lease, self.rv = body.spec, self.rv + 1


def test_leader_election_on_a_fake_clock():
    api, now = FakeLeases(), [0.0]
    a = LeaderElector(api, "ns", "l", "a", 15, 10, 2, clock=lambda: now[0])
    b = LeaderElector(api, "ns", "l", "b", 15, 10, 2, clock=lambda: now[0])
    assert a._try() and not b._try()  # a creates the lease; b sees it held
    a._leading, a._renewed = True, now[0]
    assert a.is_leader() and b._expires == 15.0  # b will try again when it expires, as it saw it
    now[0] = 9.9
    assert a.is_leader()
    api.fail = True  # a cannot renew: it stops acting once the renew deadline has passed
    assert not a._try()
    now[0] = 10.0
    assert not a.is_leader()  # at once, 5 s before anyone may take over
    api.fail = False
    now[0] = 14.9
    assert not b._try()
    now[0] = 15.0
    assert b._try() and api.lease.holder_identity == "b" and api.lease.lease_transitions == 1


class FakeScales:
    """CustomObjectsApi's scale calls on one object; `conflicts` 409s before a write goes through."""

    def __init__(self, replicas=1, conflicts=0, missing=False):
        self.replicas, self.rv, self.conflicts, self.missing = replicas, 1, conflicts, missing
        self.calls = []

    def get_namespaced_custom_object_scale(self, *args, **kw):
        self.calls.append("get-scale")
        if self.missing:
            raise ApiException(status=404, reason="NotFound")
        return self._scale()

    def _scale(self):
        return {"metadata": {"resourceVersion": str(self.rv)}, "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": "app=x"}}

    def get_namespaced_custom_object(self, *args, **kw):
        return {"status": {"readyReplicas": self.replicas - 1}}

    def replace_namespaced_custom_object_scale(self, g, v, ns, p, name, body, **kw):
        self.calls.append("put-scale")
        if self.conflicts:
            self.conflicts -= 1
            self.rv += 1  # somebody else wrote
            raise ApiException(status=409, reason="Conflict")
        assert body["metadata"]["resourceVersion"] == str(self.rv)
        self.replicas, self.rv = body["spec"]["replicas"], self.rv + 1
        return self._scale()


DEPLOY = Resource("apps", "v1", "deployments", "Deployment")


def test_the_scale_target_retries_conflicts_on_a_fresh_read():
    api, scaled = FakeScales(replicas=2, conflicts=2), []
    t = KubeScaleTarget(api, DEPLOY, "ns", "x", on_scaled=lambda *a: scaled.append(a))
    assert t.replicas() == (2, 1) and t.selector == "app=x" and t.starting() == 1
    t.scale(5, "r")
    assert api.replicas == 5 and t.conflicts == 2 and scaled == [(2, 5, "r")]
    assert api.calls == ["get-scale", "put-scale", "get-scale", "put-scale", "get-scale", "put-scale"]
    t.scale(5, "r")  # nothing to do: no write
    assert api.calls[-1] == "put-scale" and len(api.calls) == 6


def test_the_scale_target_reports_a_missing_target_and_writes_nothing_unless_leading():
    with pytest.raises(TargetNotFound):
        KubeScaleTarget(FakeScales(missing=True), DEPLOY, "ns", "x").replicas()
    api = FakeScales(replicas=1)
    t = KubeScaleTarget(api, DEPLOY, "ns", "x", may_write=lambda: False)
    with pytest.raises(NotLeader):
        t.scale(3, "r")
    assert "put-scale" not in api.calls and api.replicas == 1


@pytest.mark.parametrize("selector, labels, match", [
    ("app=x", {"app": "x"}, True), ("app=x,tier!=db", {"app": "x", "tier": "db"}, False),
    ("app in (x, y)", {"app": "y"}, True), ("app notin (x)", {"app": "x"}, False),
    ("!canary", {"app": "x"}, True), ("canary", {"app": "x"}, False), ("", {}, True),
])
def test_label_selectors(selector, labels, match):
    assert match_labels(parse_labels(selector), labels) is match


def test_selector_string_of_a_label_selector():
    sel = {"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [{"key": "c", "operator": "In",
                                                                      "values": ["y", "x"]},
                                                                    {"key": "d", "operator": "DoesNotExist"}]}
    assert selector_string(sel) == "a=1,b=2,c in (x,y),!d"
