"""Scenario files in the one validation style (file, line and field in every error), specs inline or in a
file checked when the scenario loads, non-UTF-8 text, the provisioning delay's two keys, and the keys
the examples use."""

from pathlib import Path

import pytest

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
