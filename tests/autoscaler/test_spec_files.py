"""Spec files: errors naming file, line and field, both SLO spellings (in specs and scenarios alike), and
policy option defaults written once (the class's), in the schema and the CRD."""

import inspect

import pytest

from autoscaler.batch_backlog import BacklogOptions
from autoscaler.crd import crd
from autoscaler.forecast import DemandOptions
from autoscaler.kpa import KpaSpec
from autoscaler.ratio import RatioPolicy
from autoscaler.registry import lookup, option_fields
from autoscaler.schema import defaults_of, inference_autoscaler, policy_schema
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy
from autoscaler.spec import load_spec, make_policy
from simulator.scenario import load_scenario

SCENARIO = """\
name: t
duration: 60
workload:
  arrivals: {rate: 1}
  prompt_tokens: 100
  output_tokens: 10
pools:
  - name: p
    latency_model: h100-llama2-70b-tp4
    replicas: 1
slo:
  ttft: {percentile: 90, seconds: 2.0}
"""

SPEC = """\
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: x}
spec:
  scaleTargetRef: {name: llama}
  maxReplicas: 8
  slo:
    ttft: {percentile: 90, seconds: 2.0}
  policy:
    type: ratio
"""

SO = """\
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: x}
spec:
  scaleTargetRef: {name: llama}
  minReplicaCount: 1
  triggers:
    - type: prometheus
      name: queue
      metadata: {query: "sum(q)", threshold: "5"}
"""


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


# ---- spec errors: file, line, field -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, old, new, marker, message",
    [
        (SO, '"5"', '"five"', "five", "spec.triggers[0].metadata.threshold: must be a number"),
        (
            SO,
            "minReplicaCount: 1",
            "minReplicaCount: 1\n  maxReplicaCount: 0",
            "minReplicaCount",
            "spec.minReplicaCount: must be <= maxReplicaCount",
        ),
        (
            SO,
            "minReplicaCount: 1",
            "minReplicaCount: 1\n  cooldownPerod: 3",
            "cooldownPerod",
            "spec.cooldownPerod: unknown field",
        ),
        (
            SPEC,
            "type: ratio",
            "type: ratio\n    ratio: {clamp: 0}",
            "clamp",
            "spec.policy.ratio.clamp: must be > 0",
        ),
        (
            SPEC,
            "maxReplicas: 8",
            "maxReplicas: 8\n  minReplicas: 9",
            "minReplicas",
            "spec.minReplicas: must be <= maxReplicas",
        ),
        (SPEC, "seconds: 2.0}", "seconds: 2.0, seconds: 3}", "ttft", "invalid YAML: duplicate key 'seconds'"),
    ],
)
def test_spec_errors_name_file_line_and_field(text, old, new, marker, message):
    bad = text.replace(old, new, 1)
    with pytest.raises(ValueError) as err:
        load_spec(bad, path="specs/x.yaml")
    assert f"specs/x.yaml:{line_of(bad, marker)}: {message}" in str(err.value)


def test_spec_formula_and_trigger_name_errors_have_lines():
    text = SO + "  advanced:\n    scalingModifiers: {formula: queue + nope, target: '2'}\n"
    with pytest.raises(ValueError, match=r"^so\.yaml:12: spec\.advanced\.scalingModifiers\.formula: unknown"):
        load_spec(text, path="so.yaml")
    twice = SO + "    - type: prometheus\n      name: queue\n      metadata: {query: q, threshold: '1'}\n"
    with pytest.raises(ValueError, match=r"^so\.yaml:12: spec\.triggers\[1\]\.name: duplicate trigger name"):
        load_spec(twice, path="so.yaml")


# ---- SLO targets: one class, both spellings in both files ------------------------------------------


def test_both_slo_spellings_in_specs_and_scenarios():
    want = [SloTarget("ttft", 90.0, 2.0)]
    for spelling in ("{percentile: 90, seconds: 2.0}", "{percentile: 90, threshold: 2.0}", "{threshold: 2}"):
        assert load_spec(SPEC.replace("{percentile: 90, seconds: 2.0}", spelling)).slos == want
        assert load_scenario(SCENARIO.replace("{percentile: 90, seconds: 2.0}", spelling)).slos == want
    assert load_scenario(SCENARIO.replace("{percentile: 90, seconds: 2.0}", "2")).slos == want
    with pytest.raises(ValueError, match="spec.slo.ttft: give one of seconds, threshold"):
        load_spec(SPEC.replace("{percentile: 90, seconds: 2.0}", "{percentile: 90}"))
    with pytest.raises(ValueError, match="spec.slo.ttft.percentile: must be < 100"):
        load_spec(SPEC.replace("percentile: 90", "percentile: 100"))
    assert load_scenario(SCENARIO.replace("percentile: 90", "percentile: 100")).slos[0].percentile == 100.0
    slo = want[0]
    assert (slo.name, slo.threshold) == (slo.metric, slo.seconds)  # the names the report reads


# ---- policy option defaults: written once, in the class -------------------------------------------


def _signature_defaults(cls) -> dict:
    return {k: v.default for k, v in inspect.signature(cls).parameters.items() if v.default is not v.empty}


def test_schema_defaults_are_the_policy_classes():
    policy = policy_schema()
    for ptype, cls in (("ratio", RatioPolicy), ("sloModel", SloModelPolicy)):
        fields = option_fields(lookup(ptype))
        options = {f.metadata["spec"]: f.name for f in fields}
        block = policy["properties"][ptype]["properties"]
        assert set(options) == set(block), f"{ptype}: every option maps to a keyword of {cls.__name__}"
        sig = {**_signature_defaults(cls), **_signature_defaults(DemandOptions)}  # the forecast's own
        # and the batch backlog rule's (BacklogOptions), its fields named batch_<name> in the spec's options
        sig.update({f"batch_{k}": v for k, v in _signature_defaults(BacklogOptions).items()
                    if f"batch_{k}" not in sig})
        assert {options[k]: v for k, v in defaults_of(policy["properties"][ptype]).items()} == {
            kw: sig[kw] for kw in options.values()
        }
    ia = defaults_of(inference_autoscaler()["properties"]["spec"])
    assert ia["startupDelaySeconds"] == _signature_defaults(SloModelPolicy)["startup_delay"]


class _Step:
    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context):
        return 10.0 + 0.05 * prefill_tokens + 0.1 * decode_seqs


def test_a_spec_without_options_gets_the_class_defaults():
    spec = load_spec(SPEC)
    ratio, plain = make_policy(spec), RatioPolicy(spec.slos)
    assert (ratio.up, ratio.down, ratio.clamp, ratio.window) == (
        plain.up,
        plain.down,
        plain.clamp,
        plain.window,
    )
    slo_model = make_policy(load_spec(SPEC.replace("type: ratio", "type: sloModel")), latency_model=_Step())
    plain = SloModelPolicy(spec.slos, _Step())
    assert slo_model.forecast.options == plain.forecast.options == DemandOptions()
    for kw in ["margin", "scale_down_delay", "max_batch_seqs", "prompt_cv", "startup_delay"]:
        attr = {"max_batch_seqs": "max_batch"}.get(kw, kw)
        assert getattr(slo_model, attr) == getattr(plain, attr), kw
    kpa = make_policy(load_spec(SPEC.replace("type: ratio", "type: kpa")))
    assert kpa.spec == KpaSpec(target_value=100.0 * 0.7)  # Knative's 100 x 70%, the rest KpaSpec's own
    some = make_policy(load_spec(SPEC.replace("type: ratio", "type: ratio\n    ratio: {clamp: 3}")))
    assert some.clamp == 3 and some.up == RatioPolicy(spec.slos).up


def test_the_crd_states_the_same_defaults():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    policy = schema["properties"]["spec"]["properties"]["policy"]["properties"]
    for ptype in ("ratio", "sloModel", "kpa"):
        stated = {k: v["default"] for k, v in policy[ptype]["properties"].items() if "default" in v}
        assert stated == defaults_of(policy_schema()["properties"][ptype]), ptype
