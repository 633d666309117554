"""The controller's settings are one dataclass (ControllerArgs): the CLI flags take their defaults from
it, the Kubernetes controller and the local fleet take one, and one build_loop builds every loop."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from autoscaler.spec import load_spec
from controlplane.assemble import build_loop
from controlplane.controller import AutoscalerLoop
from controlplane.settings import ControllerArgs, from_cli
from controlplane.sources.base import DEFAULT_WINDOW
from controlplane.targets import MemoryTarget
from simulator.scenario import Scenario
from slopilot.commands import control, fleet

SLO_MODEL = """\
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: llama}
spec:
  scaleTargetRef: {name: llama}
  maxReplicas: 4
  slo: {ttft: {percentile: 90, seconds: 2}}
  policy: {type: sloModel}
"""


def parse(module, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p.parse_args(argv)


def test_the_flags_defaults_are_the_dataclass():
    assert from_cli(parse(control, [])) == ControllerArgs()
    args = parse(control, ["--workers", "3", "--timeout", "1.5", "--no-leader-election", "--lease-name", "x",
                           "--scrape", "http://a/metrics", "--scrape", "http://b/metrics"])
    assert from_cli(args) == ControllerArgs(workers=3, timeout=1.5, leader_election=False, lease_name="x",
                                            scrape=["http://a/metrics", "http://b/metrics"])
    assert parse(fleet, ["up", "f.yaml"]).rate_window == ControllerArgs.window


def test_the_window_is_the_simulators():
    assert ControllerArgs.window == DEFAULT_WINDOW == Scenario.rate_window


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        from_cli(parse(control, ["--workers", "0"]))
    with pytest.raises(ValueError, match="window: must be > 0"):
        ControllerArgs(window=0)


def test_build_loop_refuses_a_missing_latency_model_before_any_source_starts(tmp_path):
    started = []
    settings = ControllerArgs(decision_log=str(tmp_path / "d-{name}.csv"))
    with pytest.raises(ValueError, match=r"s\.yaml: llama is an sloModel policy: .*--latency-model"):
        build_loop(load_spec(SLO_MODEL), settings, lambda spec: started.append("target"),
                   lambda spec, target: started.append("source"), None, where="s.yaml")
    assert started == [] and not list(tmp_path.iterdir())


def test_build_loop_wires_target_source_and_log(tmp_path):
    class Model:
        def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context):
            return 10.0 + 0.05 * prefill_tokens + 0.1 * decode_seqs

    settings = ControllerArgs(decision_log=str(tmp_path / "d-{name}.csv"))
    seen = {}

    def source(spec, target):
        seen["target"] = target
        return "source"

    loop = build_loop(load_spec(SLO_MODEL), settings, lambda spec: MemoryTarget(2, name=spec.name), source,
                      Model(), several=True)
    assert isinstance(loop, AutoscalerLoop) and loop.target is seen["target"] and loop.source == "source"
    assert loop.log is not None and (tmp_path / "d-llama.csv").exists()
    loop.log.close()
    with pytest.raises(ValueError, match=r"must contain \{name\}"):
        build_loop(load_spec(SLO_MODEL), dataclasses.replace(settings, decision_log=str(tmp_path / "d.csv")),
                   lambda spec: MemoryTarget(2), source, Model(), several=True)
