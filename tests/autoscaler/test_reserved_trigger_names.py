"""Trigger names that collide with the decision log's own columns are refused when the spec loads (issue:
a trigger named `ttft_p90` made `slopilot replay --spec SPEC --metrics decisions.csv`, the very command
`fleet up` prints, fail with "column(s) ttft_p90 given twice"). Every reserved name is refused with
the list; the log of a spec whose names are allowed replays to the same decisions."""

from __future__ import annotations

import csv
import io

import pytest

from autoscaler import load_spec, make_policy
from autoscaler.series import RESERVED_NAMES
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog, columns
from controlplane.targets import MemoryTarget
from slopilot.cli import main
from tests.controlplane.test_cp_controller import Script, run_ticks


class Named(Script):
    """The scripted values as the trigger named `ttft`."""

    def observe(self, spec, now, current, ready=None):
        obs = super().observe(spec, now, current, ready)
        obs.metrics["ttft"] = obs.metrics.pop("queue")
        return obs

SPEC = """apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama}
spec:
  scaleTargetRef: {name: llama-70b}
  maxReplicaCount: 10
  triggers:
    - type: prometheus
      name: NAME
      metadata: {query: "sum(vllm:num_requests_waiting)", threshold: "5"}
"""
LIST = ", ".join(RESERVED_NAMES)


def test_the_reserved_names_are_exactly_the_decision_logs_own_columns():
    assert set(RESERVED_NAMES) == set(columns([]))
    assert set(columns(["queue"])) - set(RESERVED_NAMES) == {"queue"}


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_every_reserved_name_is_refused_at_load_with_the_list(name):
    with pytest.raises(ValueError) as err:
        load_spec(SPEC.replace("NAME", name), path="so.yaml")
    assert str(err.value) == (f"so.yaml:9: spec.triggers[0].name: {name!r} is reserved: the decision log "
                              f"and replay series have a column of that name; reserved names: {LIST}")


def test_replay_and_control_say_so_on_the_issues_spec(tmp_path, capsys):
    (tmp_path / "so.yaml").write_text(SPEC.replace("NAME", "ttft_p90"))
    (tmp_path / "log.csv").write_text("time,ttft_p90\n0,1\n")
    assert main(["replay", "--spec", str(tmp_path / "so.yaml"), "--metrics", str(tmp_path / "log.csv")]) == 2
    assert "spec.triggers[0].name: 'ttft_p90' is reserved" in capsys.readouterr().err
    assert main(["control", "--spec", str(tmp_path / "so.yaml"), "--prometheus", "http://127.0.0.1:9",
                 "--once", "--dry-run"]) == 2
    assert "spec.triggers[0].name: 'ttft_p90' is reserved" in capsys.readouterr().err


def test_a_log_of_an_allowed_name_replays_to_the_same_decisions(tmp_path):
    spec = load_spec(SPEC.replace("NAME", "ttft"))  # an aggregate's stem, not a column
    log = DecisionLog(tmp_path / "decisions.csv", ["ttft"])
    loop = AutoscalerLoop(spec, make_policy(spec), Named([0, 30, 60, 60, 0, 0]), MemoryTarget(1),
                          log_file=log)
    assert max(s.desired for s in run_ticks(loop, 6)) > 1
    log.close()
    (tmp_path / "so.yaml").write_text(SPEC.replace("NAME", "ttft"))
    out = tmp_path / "replayed.csv"
    assert main(["replay", "--spec", str(tmp_path / "so.yaml"), "--metrics", str(tmp_path / "decisions.csv"),
                 "-o", str(out)]) == 0
    logged = list(csv.DictReader(io.StringIO((tmp_path / "decisions.csv").read_text())))
    replayed = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["time"], r["desired_replicas"]) for r in logged] == [
        (r["time"], r["desired_replicas"]) for r in replayed]
