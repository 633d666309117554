"""Issue finding 12: an autoscaler's name becomes its state file's and decision log's name, so it must
be a Kubernetes name: `../../escaped`, `a/b` and an empty name are refused with the file and line,
before anything is written; a state file holding a JSON list is a clear error, not an AttributeError."""

from __future__ import annotations

import pytest

from controlplane import specs
from controlplane.state import StateStore
from slopilot.cli import main

SPEC = """apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {name}
spec:
  scaleTargetRef: {{name: llama}}
  maxReplicaCount: 5
  triggers:
  - type: prometheus
    name: queue
    metadata: {{serverAddress: "http://127.0.0.1:1", query: "sum(x)", threshold: "5"}}
"""


@pytest.mark.parametrize("name", ['"../../escaped"', "a/b", '""', "Upper", '"a..b"', "x" * 254])
def test_names_that_are_not_kubernetes_names_are_refused(tmp_path, name):
    f = tmp_path / "so.yaml"
    f.write_text(SPEC.format(name=name))
    with pytest.raises(ValueError, match=r"so.yaml:4: metadata.name: .* is not a Kubernetes name"):
        specs.load([f])


def test_control_refuses_an_escaping_name_and_writes_nothing_outside(tmp_path, capsys):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    f = work / "so.yaml"
    f.write_text(SPEC.format(name='"../../escaped"'))
    rc = main(["control", "--spec", str(f), "--state-dir", str(work / "state"), "--once",
               "--decision-log", str(work / "logs" / "d-{name}.csv")])
    assert rc == 2
    assert "is not a Kubernetes name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "so.yaml"]


def test_the_state_store_never_makes_a_path_outside_its_folder(tmp_path):
    store = StateStore(tmp_path / "s")
    for bad in ("../../escaped", "a/b", ""):
        with pytest.raises(ValueError, match="not a Kubernetes name"):
            store.save(bad, {"policy": {}})
    assert list(tmp_path.rglob("*.json")) == []


def test_a_state_file_holding_a_list_is_a_clear_error(tmp_path):
    store = StateStore(tmp_path)
    (tmp_path / "llama.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"llama.json: saved policy state must be a JSON object"):
        store.load("llama")


@pytest.mark.parametrize("char", ["\x00", "\x07"])
def test_a_control_character_in_a_spec_names_file_and_line(tmp_path, char):
    f = tmp_path / "so.yaml"
    f.write_text(SPEC.format(name="llama").replace("maxReplicaCount: 5", f"maxReplicaCount: 5{char}"))
    with pytest.raises(ValueError, match=r"so.yaml:7: invalid YAML: the character .* is not allowed"):
        specs.load([tmp_path])
