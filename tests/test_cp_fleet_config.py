"""FLEET.yaml: the shipped example loads; every bad field is named with its file."""

from pathlib import Path

import pytest
import yaml

from controlplane.fleet import load_fleet_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fleet_local.yaml"

SCALED_OBJECT = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "q"},
    "spec": {"scaleTargetRef": {"name": "f"}, "minReplicaCount": 1, "maxReplicaCount": 5, "triggers": [
        {"type": "prometheus", "metadata": {"serverAddress": "http://p:9090", "query": "sum(x)",
                                            "threshold": "3"}}]},
}


def write(tmp_path: Path, doc: dict, name: str = "fleet.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def test_example_loads():
    cfg = load_fleet_config(EXAMPLE)
    assert cfg.name == "llama-local" and cfg.emulate == "h100-llama2-70b-tp4" and cfg.model is None
    assert (cfg.replicas, cfg.min_replicas, cfg.max_replicas) == (1, 1, 4)
    assert cfg.autoscaler.kind == "ScaledObject" and cfg.autoscaler.triggers[0].threshold == 4.0
    assert cfg.load.points[0] == (0.0, 1.0) and cfg.load.duration == 120.0
    args = cfg.serve_args(8123)
    assert args[:2] == ["--emulate", "h100-llama2-70b-tp4"]
    assert args[args.index("--port") + 1] == "8123" and args[args.index("--drain-timeout") + 1] == "10"
    assert args[args.index("--max-num-seqs") + 1] == "32"


def test_defaults_from_the_autoscaler_and_spec_file(tmp_path):
    (tmp_path / "so.yaml").write_text(
        "apiVersion: v1\nkind: TriggerAuthentication\nmetadata: {name: a}\n---\n"
        + yaml.safe_dump(SCALED_OBJECT))
    cfg = load_fleet_config(write(tmp_path, {"model": "tiny", "autoscaler": "so.yaml",
                                             "engine": {"no_prefix_caching": True, "seed": 3}}))
    assert cfg.name == "fleet"  # the file's stem
    assert (cfg.min_replicas, cfg.max_replicas, cfg.replicas) == (1, 5, 1)
    assert [d["kind"] for d in cfg.autoscaler_docs] == ["TriggerAuthentication", "ScaledObject"]
    args = cfg.serve_args(9000)
    assert args[:2] == ["--model", "tiny"] and "--no-prefix-caching" in args
    assert args[args.index("--seed") + 1] == "3"


def test_emulate_path_is_relative_to_the_file(tmp_path):
    cfg = load_fleet_config(write(tmp_path, {"emulate": "models/m.json", "max_replicas": 2}))
    assert cfg.emulate == str(tmp_path / "models" / "m.json")
    assert (cfg.min_replicas, cfg.replicas, cfg.max_replicas) == (0, 1, 2)


@pytest.mark.parametrize("doc, field", [
    ({"emulate": "m", "colour": "red"}, "colour: unknown key"),
    ({"max_replicas": 2}, "emulate: give exactly one of"),
    ({"emulate": "m", "model": "tiny"}, "emulate: give exactly one of"),
    ({"emulate": "m", "max_replicas": 0}, "max_replicas: must be > 0"),
    ({"emulate": "m", "max_replicas": 2.5}, "max_replicas: must be an integer"),
    ({"emulate": "m", "min_replicas": 3, "max_replicas": 2}, "min_replicas: must be <= max_replicas"),
    ({"emulate": "m", "replicas": 5, "max_replicas": 2}, "replicas: must be within"),
    ({"emulate": "m", "drain_timeout": -1}, "drain_timeout: must be >= 0"),
    ({"emulate": "m", "start_timeout": "soon"}, "start_timeout: must be a number"),
    ({"emulate": "m", "engine": {"port": 1}}, "engine.port: is set by the fleet"),
    ({"emulate": "m", "engine": {"drain-timeout": 1}}, "engine.drain-timeout: is set by the fleet"),
    ({"emulate": "m", "engine": {"max_num_seqs": [1]}}, "engine.max_num_seqs: must be a number"),
    ({"emulate": "m", "engine": ["--x"]}, "engine: must be a mapping"),
    ({"emulate": "m", "autoscaler": "missing.yaml"}, "autoscaler: no such spec file"),
    ({"emulate": "m", "autoscaler": 3}, "autoscaler: must be a spec file path"),
    ({"emulate": "m", "autoscaler": {"kind": "Deployment"}}, "autoscaler: must hold exactly one of"),
    ({"emulate": "m", "autoscaler": {**SCALED_OBJECT,
                                     "spec": {**SCALED_OBJECT["spec"], "minReplicaCount": 9}}},
     "autoscaler: spec.minReplicaCount: must be <= maxReplicaCount"),
    ({"emulate": "m", "max_replicas": 2, "load": {"rate": 1, "piecewise": [[0, 1]]}},
     "load: give exactly one of rate, piecewise"),
    ({"emulate": "m", "max_replicas": 2, "load": {"piecewise": [[0, 1], [5]]}}, "load.piecewise[1]: must be"),
    ({"emulate": "m", "max_replicas": 2, "load": {"piecewise": [[5, 1], [0, 2]]}},
     "load.piecewise[1]: times must be non-decreasing"),
    ({"emulate": "m", "max_replicas": 2, "load": {"rate": 2}}, "load.duration: must be > 0"),
    ({"emulate": "m", "max_replicas": 2, "load": {"rate": 2, "duration": 5, "routing": "random"}},
     "load.routing: must be one of"),
    ({"emulate": "m", "max_replicas": 2,
      "load": {"rate": 2, "duration": 5, "output_tokens": {"dist": "zipf"}}},
     "load.output_tokens.dist: unknown distribution"),
])
def test_errors_name_file_and_field(tmp_path, doc, field):
    path = write(tmp_path, doc)
    with pytest.raises(ValueError) as err:
        load_fleet_config(path)
    assert str(err.value).startswith(f"{path}: ")
    assert field in str(err.value)


def test_not_a_mapping_and_bad_yaml(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="f.yaml: must be a mapping"):
        load_fleet_config(p)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="f.yaml: not valid YAML"):
        load_fleet_config(p)
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_fleet_config(tmp_path / "nope.yaml")
