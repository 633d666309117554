"""Specs: one schema, errors with field paths, defaults, the CRD derived from the schema."""

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from autoscaler import load_spec, make_policy
from autoscaler.crd import crd, crd_yaml
from autoscaler.schema import inference_autoscaler, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "replay"

SO = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "x"},
    "spec": {
        "scaleTargetRef": {"name": "llama"},
        "triggers": [{"type": "prometheus", "metadata": {"query": "sum(q)", "threshold": "5"}}],
    },
}


def with_(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    node[keys[-1]] = value
    return doc


def test_scaled_object_defaults_are_kedas():
    spec = load_spec(SO)
    k = spec.keda
    assert (spec.min_replicas, spec.max_replicas, spec.polling_interval) == (0, 100, 30.0)
    assert (k.cooldown_period, k.initial_cooldown_period, k.idle_replica_count) == (300, 0, None)
    t = k.triggers[0]
    assert (t.name, t.metric_type, t.activation_threshold, t.ignore_null_values) == (
        "s0",
        "AverageValue",
        0.0,
        True,
    )


@pytest.mark.parametrize(
    "path,value,message",
    [
        (
            "spec.triggers.0.metadata.threshold",
            "five",
            "spec.triggers[0].metadata.threshold: must be a number",
        ),
        ("spec.triggers.0.metadata.threshold", 5, None),  # a plain number is accepted too
        ("spec.triggers.0.type", "kafka", "spec.triggers[0].type: only prometheus triggers are supported"),
        ("spec.minReplicaCount", -1, "spec.minReplicaCount: must be >= 0"),
        ("spec.pollingInterval", "30s", "spec.pollingInterval: must be an integer"),
        ("spec.cooldownPerod", 30, "spec.cooldownPerod: unknown field (allowed: advanced, cooldownPeriod,"),
        ("spec.triggers", [], "spec.triggers: must have at least 1 item(s)"),
        ("spec.fallback", {"replicas": 3}, "spec.fallback.failureThreshold: is required"),
        (
            "spec.advanced",
            {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"selectPolicy": "Fastest"}}}},
            "behavior.scaleDown.selectPolicy: must be one of Max, Min, Disabled",
        ),
        (
            "spec.triggers.0.metricType",
            "Utilization",
            "spec.triggers[0].metricType: must be one of Value, AverageValue",
        ),
        (
            "spec.triggers.0.metadata.ignoreNullValues",
            "maybe",
            "spec.triggers[0].metadata.ignoreNullValues: must be true",
        ),
    ],
)
def test_schema_errors_name_the_field(path, value, message):
    doc = with_(SO, path, value)
    if message is None:
        load_spec(doc)
        return
    with pytest.raises(ValueError) as err:
        load_spec(doc)
    assert message in str(err.value)


def test_missing_scale_target_and_wrong_kind():
    doc = copy.deepcopy(SO)
    del doc["spec"]["scaleTargetRef"]
    with pytest.raises(ValueError, match=r"spec\.scaleTargetRef: is required"):
        validate(doc)
    with pytest.raises(ValueError, match="apiVersion/kind"):
        validate({**SO, "kind": "Deployment"})


def test_cross_field_checks():
    with pytest.raises(ValueError, match="minReplicaCount: must be <= maxReplicaCount"):
        load_spec(with_(with_(SO, "spec.minReplicaCount", 5), "spec.maxReplicaCount", 2))
    with pytest.raises(ValueError, match="idleReplicaCount: must be less than minReplicaCount"):
        load_spec(with_(with_(SO, "spec.minReplicaCount", 1), "spec.idleReplicaCount", 1))
    mods = {"scalingModifiers": {"formula": "s0 + nope", "target": "2"}}
    with pytest.raises(ValueError, match=r"scalingModifiers\.formula: unknown trigger name\(s\) nope"):
        load_spec(with_(SO, "spec.advanced", mods))
    bad = {"scalingModifiers": {"formula": "s0 +* 2", "target": "2"}}
    with pytest.raises(ValueError, match=r"scalingModifiers\.formula"):
        load_spec(with_(SO, "spec.advanced", bad))


def test_inference_autoscaler_errors_and_defaults():
    ia = yaml.safe_load((EXAMPLES / "ratio.yaml").read_text())
    spec = load_spec(ia)
    assert (spec.policy_type, spec.min_replicas, spec.max_replicas, spec.polling_interval) == (
        "ratio",
        2,
        16,
        15.0,
    )
    assert [(s.metric, s.percentile, s.seconds) for s in spec.slos] == [
        ("ttft", 90.0, 2.0),
        ("tpot", 90.0, 0.1),
    ]
    with pytest.raises(ValueError, match=r"spec\.slo\.ttft\.seconds: must be > 0"):
        load_spec(with_(ia, "spec.slo.ttft.seconds", 0))
    with pytest.raises(
        ValueError, match=r"spec\.policy\.type: must be one of keda, hpa, ratio, sloModel, kpa"
    ):
        load_spec(with_(ia, "spec.policy.type", "magic"))
    no_slo = copy.deepcopy(ia)
    del no_slo["spec"]["slo"]
    with pytest.raises(ValueError, match=r"spec\.slo: is required for the ratio policy"):
        load_spec(no_slo)
    with pytest.raises(ValueError, match=r"spec\.policy\.keda: is required"):
        load_spec(with_(ia, "spec.policy", {"type": "keda"}))
    with pytest.raises(ValueError, match="latency model"):
        make_policy(load_spec((EXAMPLES / "slo_model.yaml").read_text()))


def test_yaml_syntax_error_is_a_value_error():
    with pytest.raises(ValueError, match="line 1: invalid YAML"):
        load_spec("spec: [unclosed")


def test_every_example_spec_loads():
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert len(names) >= 5
    for p in EXAMPLES.glob("*.yaml"):
        assert load_spec(p.read_text()).name


def _walk(node, path="openAPIV3Schema"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")


def test_crd_is_generated_from_the_schema_and_structural():
    on_disk = (ROOT / "deploy" / "crds" / "inferenceautoscaler.yaml").read_text()
    assert on_disk == crd_yaml(), "deploy/crds is stale: run python -m autoscaler.crd > deploy/crds/..."
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert isinstance(node, dict)
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path}: no type (not structural)"
        assert node.get("additionalProperties") is not False, path
        assert "anyOf" not in node and "x-number" not in node, path
    # the CRD's field set is the schema's: same spec properties, same policy types
    spec_props = schema["properties"]["spec"]["properties"]
    assert set(spec_props) == set(inference_autoscaler()["properties"]["spec"]["properties"])
    assert spec_props["policy"]["properties"]["type"]["enum"] == [
        "keda", "hpa", "ratio", "sloModel", "kpa", "pdModel"]


def test_examples_pass_the_crd_schema_too():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for p in EXAMPLES.glob("*.yaml"):
        doc = yaml.safe_load(p.read_text())
        if doc["kind"] == "InferenceAutoscaler":
            jsonschema.Draft4Validator(schema).validate(doc)  # OpenAPI v3.0 bounds, as draft 4


class _Step:
    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context):
        return 10.0 + 0.05 * prefill_tokens + 0.1 * decode_seqs


@pytest.mark.parametrize(
    "options, attrs",
    [
        (
            {},
            {
                "trend_window": 60.0,
                "burst_rise": 0.2,
                "burst_z": 4.0,
                "drain_seconds": 60.0,
                "burst_slope": "trend",
                "drop_on_fall": False,
            },
        ),
        (
            {
                "trendWindowSeconds": 45,
                "burstRise": 0.5,
                "burstZ": 2.5,
                "drainSeconds": 30,
                "burstSlope": "last",
                "dropOnFall": True,
            },
            {
                "trend_window": 45,
                "burst_rise": 0.5,
                "burst_z": 2.5,
                "drain_seconds": 30,
                "burst_slope": "last",
                "drop_on_fall": True,
            },
        ),
        ({"burstZ": 0}, {"burst_z": 0}),
    ],
)
def test_slo_model_burst_options_reach_the_policy(options, attrs):
    ia = yaml.safe_load((EXAMPLES / "slo_model.yaml").read_text())
    policy = make_policy(load_spec(with_(ia, "spec.policy.sloModel", options)), latency_model=_Step())
    assert {k: getattr(policy.forecast.options, k) for k in attrs} == attrs


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("trendWindowSeconds", 0, "spec.policy.sloModel.trendWindowSeconds: must be > 0"),
        ("burstRise", -0.1, "spec.policy.sloModel.burstRise: must be >= 0"),
        ("burstZ", "4", "spec.policy.sloModel.burstZ: must be a number"),
        ("burstSigma", 3, "spec.policy.sloModel.burstSigma: unknown field"),
        ("burstSlope", "steep", "spec.policy.sloModel.burstSlope: must be one of trend, last"),
        ("dropOnFall", "yes", "spec.policy.sloModel.dropOnFall: must be true or false"),
    ],
)
def test_slo_model_burst_options_are_checked(field, value, message):
    ia = yaml.safe_load((EXAMPLES / "slo_model.yaml").read_text())
    with pytest.raises(ValueError) as err:
        load_spec(with_(ia, f"spec.policy.sloModel.{field}", value))
    assert message in str(err.value)
