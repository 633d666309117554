"""Issue findings 7 and 8: values at or above ~1.8e305 (HPA's milli arithmetic overflowed), and NaN
or +-Inf (the KPA's windows raised until the sample left them). Now such a value is a failed read for
its tick: a decision row every tick, counted in source_errors, KEDA's fallback or a hold; the KPA's
windows never take it; `slopilot replay` answers without a traceback."""

from __future__ import annotations

import math

from autoscaler import load_spec, make_policy
from autoscaler.hpa_replicas import INT64_MAX, to_milli
from autoscaler.kpa import KpaPolicy, KpaSpec
from autoscaler.observation import Observation
from autoscaler.reconcile import decide
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog
from controlplane.targets import MemoryTarget
from controlplane.telemetry import Telemetry
from slopilot.cli import main

KEDA = """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama}
spec:
  scaleTargetRef: {name: llama-70b}
  pollingInterval: 15
  minReplicaCount: 1
  maxReplicaCount: 10
  fallback: {failureThreshold: 1, replicas: 6}
  triggers:
    - type: prometheus
      name: queue
      metadata: {serverAddress: "http://prometheus:9090", query: "sum(vllm:num_requests_waiting)",
                 threshold: "5"}
"""


class Values:
    def __init__(self, values):
        self.values, self.i = list(values), 0

    def observe(self, spec, now, current, ready=None):
        v = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        return Observation(now, current, ready, metrics={"queue": v})


def test_to_milli_never_overflows():
    assert to_milli(1.8e306) == INT64_MAX and to_milli(math.inf) == 0 and to_milli(2.5) == 2500


def test_huge_trigger_values_are_failed_reads_live(tmp_path):
    spec = load_spec(KEDA)
    tel = Telemetry()
    log = DecisionLog(tmp_path / "d.csv", ["queue"])
    loop = AutoscalerLoop(spec, make_policy(spec), Values([10, 1.8e306, 1e300, 1e300, 10]), MemoryTarget(2),
                          log_file=log, telemetry=tel)
    steps = [loop.tick(15.0 * i) for i in range(5)]
    log.close()
    assert steps[0].desired == 2  # 10 / 5 per replica on 2
    assert all("errors: queue" in s.decision.reason for s in steps[1:4])
    # a hold on the first failure, then KEDA's fallback (6) past failureThreshold, at HPA's scale-up pace
    assert [s.desired for s in steps[1:4]] == [2, 4, 6]
    assert tel.source_errors.labels("llama", "queue")._value.get() == 3
    rows = (tmp_path / "d.csv").read_text().splitlines()
    assert len(rows) == 6  # a header and a row every tick


def test_replay_of_extreme_values_never_tracebacks(tmp_path, capsys):
    (tmp_path / "so.yaml").write_text(KEDA)
    (tmp_path / "m.csv").write_text("time,queue\n0,10\n15,1.8e306\n30,inf\n45,-inf\n60,nan\n75,1e999\n"
                                    "90,10\n")
    assert main(["replay", "--spec", str(tmp_path / "so.yaml"), "--metrics", str(tmp_path / "m.csv"),
                 "-o", str(tmp_path / "out.csv")]) == 0
    out = (tmp_path / "out.csv").read_text().splitlines()
    assert len(out) == 8 and "Traceback" not in capsys.readouterr().err


def test_kpa_windows_skip_non_finite_samples():
    kpa = KpaPolicy(KpaSpec(target_value=10, stable_window=60, panic_window=6), max_replicas=100)
    decisions = []
    for i, v in enumerate([20, math.nan, math.inf, -math.inf, 1e306, 20, 20]):
        obs = Observation(time=2.0 * i, current_replicas=2, num_running=v, num_waiting=0.0)
        decisions.append(decide(kpa, obs))
    assert all(math.isfinite(s[1]) and s[1] < 1e15 for s in kpa.samples)
    assert [d.desired_replicas for d in decisions][-2:] == [2, 2]  # decisions on the good values again
    assert decisions[-1].reason.startswith("kpa: stable")
    assert "num_running" in decisions[2].reason  # the inf tick: a hold on the failed read
    # a saved state holding such a sample (written before this fix) loads without it
    kpa.load_state_dict({"samples": [[0.0, math.inf], [1.0, 5.0]]})
    assert kpa.samples == [[1.0, 5.0]]


def test_a_policy_error_is_a_hold_not_an_exception():
    class Broken(KpaPolicy):
        def decide(self, obs):
            raise OverflowError("cannot convert float infinity to integer")

    d = decide(Broken(KpaSpec(target_value=1)), Observation(time=0.0, current_replicas=3, num_running=1.0))
    assert d.desired_replicas == 3 and d.reason.startswith("hold: policy failed")
