"""deploy/ is valid: every manifest `kubectl kustomize` renders from the base and each overlay passes
kubernetes-validate (strict) for the Kubernetes version deploy/README.md names; custom resources pass
their CRD's schema (ours through the stand-in API server, ScaledObjects through KEDA's spec schema);
the CRD accepts every shipped example and rejects malformed ones with the field path; the KEDA overlay
is what `slopilot export keda` makes of the example; the controller's Deployment is hardened."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from kubernetes.client.rest import ApiException

from autoscaler.spec import load_spec
from tests.kube.helpers import ROOT, render

FOLDERS = ["base", "engine", "overlays/example", "overlays/keda", "overlays/prometheus"]
OURS = {("slopilot.dev/v1alpha1", "InferenceAutoscaler"), ("keda.sh/v1alpha1", "ScaledObject"),
        ("monitoring.coreos.com/v1", "PodMonitor")}


def k8s_version() -> str:
    m = re.search(r"Kubernetes\s+\*\*(\d+\.\d+)\*\*", (ROOT / "deploy" / "README.md").read_text())
    assert m, "deploy/README.md names no Kubernetes version"
    return m.group(1)


@pytest.mark.parametrize("folder", FOLDERS)
def test_rendered_manifests_pass_kubernetes_validate_strict(folder):
    version = k8s_version()
    docs = render(folder)
    assert docs
    checked = []
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if key in OURS:
            if doc["kind"] in ("InferenceAutoscaler", "ScaledObject"):
                load_spec(copy.deepcopy(doc),
                          f"deploy/{folder}")  # our schema (KEDA's spec for a ScaledObject)
            else:  # no PodMonitor schema offline: it must at least select the engine's pods and port
                engine = next(d for d in render("engine") if d["kind"] == "Deployment")
                labels = engine["spec"]["template"]["metadata"]["labels"]
                assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
                containers = engine["spec"]["template"]["spec"]["containers"]
                ports = {p["name"] for c in containers for p in c["ports"]}
                assert {e["port"] for e in doc["spec"]["podMetricsEndpoints"]} <= ports
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"deploy/{folder}: {name}: {exc.message} (at {'.'.join(map(str, exc.path))})")
        checked.append(name)
    print(f"deploy/{folder}: {len(checked)} manifests valid for Kubernetes {version}:", ", ".join(checked))


def example_autoscalers() -> list[tuple[str, dict]]:
    out = []
    paths = sorted((ROOT / "examples").rglob("*.yaml"))
    paths.append(ROOT / "deploy/overlays/example/inferenceautoscaler.yaml")
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceAutoscaler":
                out.append((str(path.relative_to(ROOT)), doc))
    return out


BAD = [  # (change, field path in the error, words of the error)
    (lambda s: s.update(maxReplicas="many"), "spec.maxReplicas", "must be of type integer"),
    (lambda s: s.update(minReplicas=-1), "spec.minReplicas", "greater than or equal to 0"),
    (lambda s: s.update(pollingInterval=0), "spec.pollingInterval", "should be greater than 0"),
    (lambda s: s["policy"].update(type="magic"), "spec.policy.type", "Unsupported value"),
    (lambda s: s.pop("scaleTargetRef"), "spec.scaleTargetRef", "Required value"),
    (lambda s: s["scaleTargetRef"].update(name=""), "spec.scaleTargetRef.name", "at least 1 chars long"),
    (lambda s: s.update(slo={"ttft": {"percentile": 90, "seconds": 1, "threshold": 1}}), "spec.slo.ttft",
     "one and only one"),
    (lambda s: s.update(replicas=3), "", 'unknown field "spec.replicas"'),
]


def test_the_crd_accepts_every_shipped_example_and_rejects_malformed_ones(cluster):
    examples = example_autoscalers()
    assert len(examples) >= 3
    cluster.namespace("examples")
    for i, (path, doc) in enumerate(examples):
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"example-{i}"}
        created = cluster.custom.create_namespaced_custom_object("slopilot.dev", "v1alpha1", "examples",
                                                                 "inferenceautoscalers", doc,
                                                                 field_validation="Strict")
        assert created["metadata"]["uid"], path
    base = copy.deepcopy(examples[0][1])
    for change, field, words in BAD:
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": "bad"}
        change(doc["spec"])
        with pytest.raises(ApiException) as err:
            cluster.custom.create_namespaced_custom_object("slopilot.dev", "v1alpha1", "examples",
                                                           "inferenceautoscalers", doc,
                                                           field_validation="Strict")
        message = json.loads(err.value.body)["message"]
        assert err.value.status in (400, 422) and words in message and field in message, message
    print(f"{len(examples)} examples accepted; {len(BAD)} malformed autoscalers rejected with the field path")


def test_the_keda_overlay_is_what_export_makes_of_the_example(tmp_path):
    out = tmp_path / "so.yaml"
    subprocess.run([sys.executable, "-m", "slopilot.cli", "export", "keda",
                    "deploy/overlays/example/inferenceautoscaler.yaml", "-o", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=60)
    assert out.read_text() == (ROOT / "deploy/overlays/keda/scaledobject.yaml").read_text(), \
        "deploy/overlays/keda is stale: rerun the command in its kustomization.yaml"


def test_the_controller_deployment_is_hardened_and_matches_the_image():
    docs = render("base")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["args"][:2] == ["control", "--kube"]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in c["ports"]}
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"USER {pod['securityContext']['runAsUser']}" in dockerfile
    assert 'ENTRYPOINT ["slopilot"]' in dockerfile
    engine = next(d for d in render("engine") if d["kind"] == "Deployment")
    (vllm,) = engine["spec"]["template"]["spec"]["containers"]
    assert vllm["livenessProbe"]["httpGet"]["path"] == "/health"
