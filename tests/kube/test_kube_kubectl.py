"""The real kubectl (1.32) against the stand-in API server: `apply -k` of deploy/base, `get` with the
CRD's printer columns, `scale`, `get --raw` of a scale subresource, an invalid InferenceAutoscaler
rejected with the field path; and the stand-in's semantics that kubectl and the client rely on
(resourceVersion on every write, 409 on a stale update, 404s, watch with bookmarks and 410)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.kube.helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

ENGINE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: llama}}
  template:
    metadata: {labels: {app: llama}}
    spec:
      containers: [{name: engine, image: vllm/vllm-openai, ports: [{name: http, containerPort: 8000}]}]
"""

AUTOSCALER = """
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: %(name)s, namespace: shop}
spec:
  scaleTargetRef: {name: llama}
  minReplicas: 1
  maxReplicas: %(max)s
  policy:
    type: keda
    keda:
      triggers:
        - type: prometheus
          name: queue
          metadata: {query: sum(vllm:num_requests_waiting), threshold: "4"}
"""


def test_kubectl_installs_the_base_and_works_with_autoscalers(empty_cluster):
    cluster = empty_cluster
    version = cluster.kubectl("version", "-o", "json").stdout
    assert json.loads(version)["clientVersion"]["minor"].startswith("32")

    done = cluster.kubectl("apply", "-k", str(ROOT / "deploy" / "base"))
    print(done.stdout)
    assert "deployment.apps/slopilot-controller created" in done.stdout
    assert "customresourcedefinition.apiextensions.k8s.io/inferenceautoscalers.slopilot.dev created" \
        in done.stdout
    # applied again: nothing changes
    again = cluster.kubectl("apply", "-k", str(ROOT / "deploy" / "base")).stdout
    assert "deployment.apps/slopilot-controller unchanged" in again

    # (kubectl's typed generators such as `create namespace` send protobuf; the stand-in speaks JSON)
    cluster.kubectl("apply", "-f", "-", stdin="apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n")
    cluster.kubectl("apply", "-f", "-", stdin=ENGINE)
    cluster.kubectl("apply", "-f", "-", stdin=AUTOSCALER % {"name": "llama-queue", "max": 5})

    # the printer columns the CRD declares, with the short name
    table = cluster.kubectl("get", "ias", "-n", "shop").stdout
    print(table)
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "TARGET", "POLICY", "MIN", "MAX"]
    assert row.split() == ["llama-queue", "llama", "keda", "1", "5"]

    # kubectl scale goes through the scale subresource; get --raw reads it back
    cluster.kubectl("scale", "deployment/llama", "-n", "shop", "--replicas=3")
    scale = json.loads(cluster.kubectl("get", "--raw",
                                       "/apis/apps/v1/namespaces/shop/deployments/llama/scale").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    assert scale["status"]["selector"] == "app=llama"
    assert cluster.get("apps/v1", "Deployment", "shop", "llama")["spec"]["replicas"] == 3

    # invalid autoscalers are rejected by the CRD's schema, naming the field
    bad = cluster.kubectl("apply", "-f", "-", check=False,
                          stdin=AUTOSCALER % {"name": "bad", "max": '"many"'})
    assert bad.returncode != 0
    assert "spec.maxReplicas" in bad.stderr and "must be of type integer" in bad.stderr, bad.stderr
    unknown = yaml.safe_load(AUTOSCALER % {"name": "bad", "max": 3})
    unknown["spec"]["policy"]["keda"]["pollingIntervall"] = 5
    bad = cluster.kubectl("apply", "-f", "-", check=False, stdin=yaml.safe_dump(unknown))
    assert bad.returncode != 0 and 'unknown field "spec.policy.keda.pollingIntervall"' in bad.stderr
    wrong = cluster.kubectl("apply", "-f", "-", check=False, stdin=(AUTOSCALER % {"name": "bad", "max": 3})
                            .replace("type: keda", "type: magic"))
    assert wrong.returncode != 0
    assert "spec.policy.type" in wrong.stderr and "Unsupported value" in wrong.stderr
    assert "bad" not in cluster.kubectl("get", "ias", "-n", "shop", "-o", "name").stdout

    # what kubectl did, in the audit log
    verbs = {(e["verb"], e["resource"], e["subresource"]) for e in cluster.api.audit
             if e["user_agent"].startswith("kubectl")}
    assert ("patch", "deployments", "scale") in verbs
    assert ("create", "customresourcedefinitions", "") in verbs


def test_the_official_client_sees_real_api_semantics(cluster):
    custom = cluster.custom
    cluster.namespace("shop")
    cluster.apply(yaml.safe_load(ENGINE))
    ia = yaml.safe_load(AUTOSCALER % {"name": "a", "max": 4})
    created = custom.create_namespaced_custom_object("slopilot.dev", "v1alpha1", "shop",
                                                     "inferenceautoscalers", ia)
    rv = created["metadata"]["resourceVersion"]
    assert created["spec"]["pollingInterval"] == 15  # the schema's default, filled by the server

    # status subresource: a status write leaves spec alone and bumps the resourceVersion
    body = {**created, "status": {"desiredReplicas": 2}, "spec": {**created["spec"], "maxReplicas": 9}}
    after = custom.replace_namespaced_custom_object_status("slopilot.dev", "v1alpha1", "shop",
                                                           "inferenceautoscalers", "a", body)
    assert after["status"] == {"desiredReplicas": 2} and after["spec"]["maxReplicas"] == 4
    assert int(after["metadata"]["resourceVersion"]) > int(rv)
    assert after["metadata"]["generation"] == 1
    # a write at the old resourceVersion: 409
    with pytest.raises(ApiException) as stale:
        custom.replace_namespaced_custom_object("slopilot.dev", "v1alpha1", "shop", "inferenceautoscalers",
                                                "a",
                                                created)
    assert stale.value.status == 409
    # 404s
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object_scale("apps", "v1", "shop", "deployments", "nope")
    assert missing.value.status == 404

    # a watch from a resourceVersion sees later writes, then bookmarks, and ends at its timeout
    events = []
    w = watch.Watch()
    start = after["metadata"]["resourceVersion"]
    cluster.apply(yaml.safe_load(AUTOSCALER % {"name": "b", "max": 2}))
    for ev in w.stream(custom.list_namespaced_custom_object, "slopilot.dev", "v1alpha1", "shop",
                       "inferenceautoscalers", resource_version=start, timeout_seconds=2,
                       allow_watch_bookmarks=True):
        events.append((ev["type"], ev["raw_object"]["metadata"].get("name")))
    assert events[0] == ("ADDED", "b")
    assert ("BOOKMARK", None) in events
    # a resourceVersion older than the history: 410 Gone
    cluster.store.compacted = int(start) + 5
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(custom.list_namespaced_custom_object, "slopilot.dev", "v1alpha1",
                                      "shop",
                                      "inferenceautoscalers", resource_version=start, timeout_seconds=1):
            pass
    assert gone.value.status == 410

    # RBAC holds: the controller's ServiceAccount may not create deployments
    from controlplane.kube.client import connect

    probe = connect(str(cluster.controller_config))
    probe.user_agent = "rbac-probe"  # not the controller's requests
    apps = client.AppsV1Api(probe)
    with pytest.raises(ApiException) as denied:
        apps.create_namespaced_deployment("shop", yaml.safe_load(ENGINE))
    assert denied.value.status == 403 and "cannot create resource" in denied.value.body
