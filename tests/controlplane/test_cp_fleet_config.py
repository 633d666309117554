"""FLEET.yaml: the shipped example loads; every bad field is named with its file."""

from pathlib import Path

import pytest
import yaml

from controlplane.fleet import load_fleet_config

ROOT = Path(__file__).resolve().parents[2]
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
    assert cfg.load.curve.points[0] == (0.0, 1.0) and cfg.load.duration == 120.0
    args = cfg.serve_args(8123)
    assert args[:2] == ["--emulate", "h100-llama2-70b-tp4"]
    assert args[args.index("--port") + 1] == "8123" and args[args.index("--drain-timeout") + 1] == "10"
    assert args[args.index("--max-num-seqs") + 1] == "32"


def test_defaults_from_the_autoscaler_and_spec_file(tmp_path):
    (tmp_path / "so.yaml").write_text(yaml.safe_dump(SCALED_OBJECT))
    cfg = load_fleet_config(write(tmp_path, {"model": "tiny", "autoscaler": "so.yaml",
                                             "engine": {"no_prefix_caching": True, "seed": 3}}))
    assert cfg.name == "fleet"  # the file's stem
    assert (cfg.min_replicas, cfg.max_replicas, cfg.replicas) == (1, 5, 1)
    assert cfg.autoscaler_path == str(tmp_path / "so.yaml") and cfg.autoscaler.name == "q"
    args = cfg.serve_args(9000)
    assert args[:2] == ["--model", "tiny"] and "--no-prefix-caching" in args
    assert args[args.index("--seed") + 1] == "3"


def test_emulate_path_is_relative_to_the_file(tmp_path):
    cfg = load_fleet_config(write(tmp_path, {"emulate": "models/m.json", "max_replicas": 2}))
    assert cfg.emulate == str(tmp_path / "models" / "m.json")
    assert (cfg.min_replicas, cfg.replicas, cfg.max_replicas) == (0, 1, 2)


LOAD = {"arrivals": {"rate": 2}, "duration": 5}


@pytest.mark.parametrize("doc, line, field", [
    ({"emulate": "m", "colour": "red"}, 1, "colour: unknown field"),
    ({"max_replicas": 2}, None, ": give one of emulate, model"),
    ({"emulate": "m", "model": "tiny"}, None, ": give only one of emulate, model"),
    ({"emulate": "m", "max_replicas": 0}, 2, "max_replicas: must be >= 1"),
    ({"emulate": "m", "max_replicas": 2.5}, 2, "max_replicas: must be an integer"),
    ({"emulate": "m", "min_replicas": 3, "max_replicas": 2}, 3, "min_replicas: must be <= max_replicas"),
    ({"emulate": "m", "replicas": 5, "max_replicas": 2}, 3, "replicas: must be within"),
    ({"emulate": "m", "drain_timeout": -1}, 1, "drain_timeout: must be >= 0"),
    ({"emulate": "m", "start_timeout": "soon"}, 2, "start_timeout: must be a number"),
    ({"emulate": "m", "engine": {"port": 1}}, 3, "engine.port: is set by the fleet"),
    ({"emulate": "m", "engine": {"drain-timeout": 1}}, 3, "engine.drain-timeout: is set by the fleet"),
    ({"emulate": "m", "engine": {"max_num_seqs": [1]}}, 3, "engine.max_num_seqs: must be a number"),
    ({"emulate": "m", "engine": ["--x"]}, 2, "engine: must be a mapping"),
    ({"emulate": "m", "autoscaler": "missing.yaml"}, 1, "autoscaler: no such spec file"),
    ({"emulate": "m", "autoscaler": 3}, 1, "autoscaler: must be a spec file path"),
    ({"emulate": "m", "autoscaler": {**SCALED_OBJECT,
                                     "spec": {**SCALED_OBJECT["spec"], "minReplicaCount": 9}}},
     None, "autoscaler.spec.minReplicaCount: must be <= maxReplicaCount"),
    ({"emulate": "m", "max_replicas": 2, "load": {"arrivals": {"rate": 1, "piecewise": [[0, 1]]}}},
     None, "load.arrivals: give only one of rate, piecewise"),
    ({"emulate": "m", "max_replicas": 2, "load": {"arrivals": {"piecewise": [[0, 1], [5]]}}},
     None, "load.arrivals.piecewise[1]: must have at least 2 item(s)"),
    ({"emulate": "m", "max_replicas": 2, "load": {"arrivals": {"piecewise": [[5, 1], [0, 2]]}}},
     None, "load.arrivals.piecewise[1]: times must be non-decreasing"),
    ({"emulate": "m", "max_replicas": 2, "load": {"arrivals": {"rate": 2}}}, None,
     "load.duration: is required"),
    ({"emulate": "m", "max_replicas": 2, "load": {**LOAD, "routing": "random"}}, None,
     "load.routing: must be one of least_outstanding, round_robin"),
    ({"emulate": "m", "max_replicas": 2, "load": {**LOAD, "output_tokens": {"dist": "zipf"}}}, None,
     "load.output_tokens.dist: unknown distribution"),
    ({"emulate": "m", "max_replicas": 2, "load": {"duration": 5}}, None, "load.arrivals: is required"),
])
def test_errors_name_file_line_and_field(tmp_path, doc, line, field):
    path = write(tmp_path, doc)
    with pytest.raises(ValueError) as err:
        load_fleet_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: " if line else f"{path}:"), message
    assert field in message


def test_not_a_mapping_and_bad_yaml(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="f.yaml:1: a fleet file must be a mapping"):
        load_fleet_config(p)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="f.yaml:2: invalid YAML"):
        load_fleet_config(p)
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_fleet_config(tmp_path / "nope.yaml")
