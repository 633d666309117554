"""Input files: the one YAML loader (duplicate keys, alias bombs, nesting, syntax errors with lines), the
one validation style (file, line and field in every error) for scenarios and specs, both SLO spellings,
the provisioning delay's two keys, and policy option defaults written once (the class's)."""

import inspect
import time
import tracemalloc
from pathlib import Path

import pytest

from autoscaler import yamlfile
from autoscaler.crd import crd
from autoscaler.forecast import DemandOptions
from autoscaler.kpa import KpaSpec
from autoscaler.ratio import RatioPolicy
from autoscaler.registry import lookup, option_fields
from autoscaler.schema import defaults_of, inference_autoscaler, policy_schema
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy
from autoscaler.spec import load_spec, make_policy
from autoscaler.yamlfile import parse
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


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---- the YAML loader -------------------------------------------------------------------------------


def test_duplicate_keys_are_errors_naming_file_and_line():
    text = "a: 1\nb:\n  c: 2\n  c: 3\n"
    with pytest.raises(ValueError, match=r"^x\.yaml:4: invalid YAML: duplicate key 'c' \(first on line 3\)"):
        parse(text, "x.yaml")
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        parse("a: 1\na: 1\n", "x.yaml")
    # a merge key's values may be overridden: only keys written twice are duplicates
    assert parse("base: &b {k: 1, j: 2}\nuse:\n  <<: *b\n  k: 3\n").data["use"] == {"k": 3, "j": 2}


def test_syntax_errors_name_file_and_line():
    with pytest.raises(ValueError, match=r"^s\.yaml:3: invalid YAML: .*expected ',' or ']'"):
        parse("a: 1\nb: [1, 2\nc: 3\n", "s.yaml")
    with pytest.raises(ValueError, match=r"^s\.yaml:2: invalid YAML: expected a single document"):
        parse("a: 1\n---\nb: 2\n", "s.yaml")
    with pytest.raises(ValueError, match=r"^line 1: invalid YAML"):  # text without a file name
        parse("a: [")


def test_alias_bomb_is_refused_fast_and_in_bounded_memory():
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):  # 9**10 values once expanded
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^bomb\.yaml:\d+: invalid YAML: aliases expand this to more than"):
        parse("\n".join(lines), "bomb.yaml")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 10.0 and peak < 20 * 2**20  # expanded, it would take hours and gigabytes
    # aliases within the budget are fine, and expand to shared values
    doc = parse("a: &a [1, 2]\nb: [*a, *a]\n")
    assert doc.data["b"] == [[1, 2], [1, 2]]


def test_recursive_alias_deep_nesting_and_size_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="alias \\*a refers to a node that contains it"):
        parse("a: &a [1, *a]\n", "r.yaml")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^d\.yaml:1: invalid YAML: nested deeper than 64 levels"):
        parse("a: " + "[" * 100_000 + "]" * 100_000, "d.yaml")
    assert time.perf_counter() - t0 < 10.0  # refused while reading, not after parsing it all
    assert parse("a: " + "[" * 60 + "]" * 60).data["a"] is not None
    with pytest.raises(ValueError, match="longer than"):
        parse("a: 1\n" + "#" * (yamlfile.MAX_CHARS + 1), "big.yaml")
    monkeypatch.setattr(yamlfile, "MAX_NODES", 1000)
    with pytest.raises(ValueError, match="more than 1000 values"):
        parse("[" + ", ".join(["1"] * 1500) + "]", "flat.yaml")


def test_document_names_the_line_of_a_field():
    text = "a: 1\nlist:\n  - x: 1\n  - x: 2\n    y: {z: 3}\n"
    doc = parse(text, "f.yaml")
    assert doc.line(("list", 1, "y", "z")) == 5
    assert doc.at("list", 1).message(("x",), "bad") == "f.yaml:4: list[1].x: bad"
    assert doc.message(("list", 7), "bad") == "f.yaml:2: list[7]: bad"  # the deepest part that exists


# ---- scenario errors: file, line, field ------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, marker, message",
    [
        ("replicas: 1", "replicas: -1", "replicas", "pools[0].replicas: must be >= 0, got -1"),
        ("replicas: 1", "replicas: 1\n    colour: red", "colour", "pools[0].colour: unknown field (allowed:"),
        ("prompt_tokens: 100", "prompt_tokens: {dist: zipf}", "prompt_tokens", "workload.prompt_tokens.dist"),
        (
            "seconds: 2.0}",
            "seconds: 2.0, threshold: 2.0}",
            "ttft",
            "slo.ttft: give only one of seconds, threshold",
        ),
        (
            "replicas: 1",
            "replicas: 1\n    kv_blocks: 10\n    kv_memory: {gpu_memory_gib: 1, weights_gib: 1, "
            "kv_bytes_per_token: 1}",
            "name: p",
            "pools[0]: give only one of kv_blocks, kv_memory",
        ),
        ("arrivals: {rate: 1}", "arrivals: {rate: 1, cv: 2}", "arrivals", "workload.arrivals.cv: a poisson"),
        ("duration: 60", "duration: .inf", "duration", "duration: must be a number, got inf"),
    ],
)
def test_scenario_errors_name_file_line_and_field(tmp_path, old, new, marker, message):
    text = SCENARIO.replace(old, new, 1)
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ValueError) as err:
        load_scenario(path)
    assert f"{path}:{line_of(text, marker)}: {message}" in str(err.value)


def test_scenario_duplicate_key_and_every_problem_at_once(tmp_path):
    text = SCENARIO.replace("replicas: 1", "replicas: 1\n    replicas: 2")
    path = write(tmp_path, "dup.yaml", text)
    with pytest.raises(
        ValueError, match=rf"{path}:11: invalid YAML: duplicate key 'replicas' \(first on line 10\)"
    ):
        load_scenario(path)
    text = SCENARIO.replace("replicas: 1", "replicas: two").replace("duration: 60", "duration: -5")
    path = write(tmp_path, "two.yaml", text)
    with pytest.raises(ValueError) as err:
        load_scenario(path)
    assert str(err.value) == (
        f"{path}:2: duration: must be > 0, got -5; "
        f"{path}:10: pools[0].replicas: must be an integer, got 'two'"
    )


def test_inline_and_file_specs_are_checked_when_the_scenario_loads(tmp_path):
    inline = SO.replace('"5"', '"five"')
    block = "\n".join("      " + line for line in inline.splitlines())
    text = SCENARIO.replace("replicas: 1", "replicas: 1\n    autoscaler:\n" + block)
    path = write(tmp_path, "inline.yaml", text)
    with pytest.raises(ValueError) as err:
        load_scenario(path)
    field = "pools[0].autoscaler.spec.triggers[0].metadata.threshold"
    want = f"{path}:{line_of(text, 'five')}: {field}: must be a number"
    assert want in str(err.value)

    spec = write(tmp_path, "spec.yaml", SPEC.replace("seconds: 2.0", "seconds: 0"))
    text = SCENARIO.replace("replicas: 1", "replicas: 1\n    autoscaler: {spec: spec.yaml}")
    path = write(tmp_path, "file.yaml", text)
    with pytest.raises(ValueError) as err:
        load_scenario(path)
    want = f"{path}:11: pools[0].autoscaler.spec: {spec.resolve()}:8: spec.slo.ttft.seconds: must be > 0"
    assert str(err.value).startswith(want)
    text = SCENARIO.replace("replicas: 1", "replicas: 1\n    autoscaler: {spec: absent.yaml}")
    with pytest.raises(
        ValueError, match=r":11: pools\[0\]\.autoscaler\.spec: file not found: .*absent\.yaml"
    ):
        load_scenario(write(tmp_path, "nospec.yaml", text))


def test_a_whole_spec_inline_is_a_pool_autoscaler():
    import yaml

    sc = load_scenario(dict(yaml.safe_load(SCENARIO), autoscaler=yaml.safe_load(SO)))
    assert sc.pools[0].autoscaler["kind"] == "spec" and sc.pools[0].autoscaler["where"] == "autoscaler"


def test_scenario_file_that_is_not_utf8(tmp_path):
    p = tmp_path / "latin.yaml"
    p.write_bytes(SCENARIO.replace("name: t", "name: caf\xe9").encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{p}: not UTF-8 text"):
        load_scenario(p)


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


# ---- provisioning delay ---------------------------------------------------------------------------


def test_provisioning_delay_and_its_older_key():
    new = load_scenario(SCENARIO.replace("replicas: 1", "replicas: 1\n    provisioning_delay: 120"))
    old = load_scenario(SCENARIO.replace("replicas: 1", "replicas: 1\n    startup_delay: 120"))
    pool = new.pools[0]
    assert pool.provisioning_delay == old.pools[0].provisioning_delay
    assert pool.provisioning_delay.params == {"value": 120.0}
    assert pool.startup_delay is pool.provisioning_delay
    with pytest.raises(ValueError, match="give only one of provisioning_delay, startup_delay"):
        load_scenario(
            SCENARIO.replace("replicas: 1", "replicas: 1\n    provisioning_delay: 1\n    startup_delay: 1")
        )


def test_example_scenarios_use_the_documented_keys():
    root = Path(__file__).resolve().parents[2] / "examples"
    scenarios = [d for d in (parse(p.read_text()).data for p in root.glob("*.yaml")) if "pools" in d]
    assert len(scenarios) >= 5
    for d in scenarios:
        assert all("startup_delay" not in p for p in d["pools"]), d["name"]
        assert all("threshold" not in v for v in d.get("slo", {}).values()), d["name"]


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
