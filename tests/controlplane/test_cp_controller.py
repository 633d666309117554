"""The live controller's loop on scripted metrics: fallback and holds, failed scales, state across a
restart, the decision log replayed by `slopilot replay`, the same decisions through the simulator's
reconcile step, telemetry, and spec files."""

from __future__ import annotations

import csv
import io
import threading
import time

import httpx
import pytest

from autoscaler import load_spec, make_policy
from autoscaler.observation import Observation
from autoscaler.reconcile import reconcile
from autoscaler.replay import observation, replay
from autoscaler.series import read_series
from controlplane import specs
from controlplane.controller import AutoscalerLoop, Controller
from controlplane.decision_log import DecisionLog
from controlplane.state import StateStore
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
  cooldownPeriod: 60
  minReplicaCount: 1
  maxReplicaCount: 10
  {fallback}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown: {stabilizationWindowSeconds: 120}
  triggers:
    - type: prometheus
      name: queue
      metadata:
        {serverAddress: "http://prometheus:9090", query: "sum(vllm:num_requests_waiting)", threshold: "5"}
"""

SLO_MODEL = """
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: llama-slo}
spec:
  scaleTargetRef: {name: llama-70b}
  minReplicas: 1
  maxReplicas: 20
  pollingInterval: 15
  startupDelaySeconds: 60
  slo:
    ttft: {percentile: 90, seconds: 2.0}
  policy:
    type: sloModel
    sloModel: {margin: 0.15, forecastWindowSeconds: 120, scaleDownDelaySeconds: 60}
"""


def keda_spec(fallback: str = ""):
    return load_spec(KEDA.replace("{fallback}", fallback))


class Script:
    """A metric source that plays a list of values (None = empty result, 'error' = the query failed)."""

    def __init__(self, values, field="queue"):
        self.values, self.field, self.i = list(values), field, 0

    def observe(self, spec, now, current, ready=None):
        v = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        obs = Observation(now, current, ready)
        if v == "error":
            obs.errors.add(self.field)
        elif self.field == "queue":
            obs.metrics["queue"] = v
        else:
            obs.arrival_rate, obs.mean_prompt_tokens, obs.mean_output_tokens = v, 1000, 200
            obs.num_waiting = 0
        return obs


class Model:
    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context) -> float:
        return 20 + 0.05 * prefill_tokens + 0.2 * decode_seqs + 0.0005 * decode_context


def run_ticks(loop: AutoscalerLoop, n: int, start: float = 1000.0, every: float = 15.0) -> list:
    return [loop.tick(start + k * every) for k in range(n)]


def test_queue_scales_up_and_down_and_replays_identically(tmp_path):
    spec = keda_spec()
    queue = [0, 2, 30, 60, 60, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    target = MemoryTarget(1)
    log = DecisionLog(tmp_path / "decisions.csv", ["queue"])
    loop = AutoscalerLoop(spec, make_policy(spec), Script(queue), target, log_file=log)
    steps = run_ticks(loop, len(queue))
    log.close()
    desired = [s.desired for s in steps]
    assert max(desired) == 10 and desired[2] > 1  # up on the first tick above the threshold
    assert desired[-1] == 1  # back down after the stabilization window
    assert [d for d, _ in target.history] == desired
    # slopilot replay on the log: the same decisions, row for row
    out = tmp_path / "replayed.csv"
    spec_file = tmp_path / "so.yaml"
    spec_file.write_text(KEDA.replace("{fallback}", ""))
    log_file = str(tmp_path / "decisions.csv")
    assert main(["replay", "--spec", str(spec_file), "--metrics", log_file, "-o", str(out)]) == 0
    logged = list(csv.DictReader(io.StringIO((tmp_path / "decisions.csv").read_text())))
    replayed = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["time"], r["desired_replicas"], r["active"], r["reason"]) for r in logged] == [
        (r["time"], r["desired_replicas"], r["active"], r["reason"]) for r in replayed
    ]


def test_the_simulators_reconcile_step_decides_the_same_on_the_logged_series(tmp_path):
    spec = keda_spec()
    log = DecisionLog(tmp_path / "d.csv", ["queue"])
    script = Script([0, 40, 80, 80, 3, 0, 0, 0, 0, 0, 0, 0])
    loop = AutoscalerLoop(spec, make_policy(spec), script, MemoryTarget(1), log_file=log)
    live = [s.desired for s in run_ticks(loop, 12)]
    log.close()
    with open(tmp_path / "d.csv", newline="") as f:
        rows, _ = read_series(f, ["queue"])

    class Pool:  # the simulator's PoolTarget only records the count
        desired = None

        def scale(self, desired, reason):
            self.desired = desired

    policy, pool, current, again = make_policy(spec), Pool(), 1, []
    for row in rows:
        reconcile(policy, observation(row, row.time, current), pool)
        again.append(pool.desired)
        current = pool.desired
    assert again == live


@pytest.mark.parametrize("fallback,expected_tail", [
    ("fallback: {failureThreshold: 2, replicas: 4}", 4),  # KEDA's fallback replicas
    ("", 6),  # no fallback: the last count is held, never a drop toward zero
])
def test_source_outage_gives_fallback_or_hold_never_zero(fallback, expected_tail):
    spec = keda_spec(fallback)
    values = [30, 30] + ["error"] * 14 + [30]
    loop = AutoscalerLoop(spec, make_policy(spec), Script(values), MemoryTarget(1))
    desired = [s.desired for s in run_ticks(loop, len(values))]
    assert desired[1] == 6
    assert min(desired[1:]) == expected_tail  # the outage never reads as an empty queue
    assert desired[-2] == expected_tail  # (the fallback waits out the scale-down stabilization window)
    assert desired[2:4] == [6, 6]  # within failureThreshold the last decision stands
    assert desired[-1] == 6  # metrics back: normal decisions resume


def test_slo_model_holds_when_its_aggregates_fail():
    spec = load_spec(SLO_MODEL)
    loop = AutoscalerLoop(spec, make_policy(spec, latency_model=Model()), Script([8.0, 8.0, "error", "error"],
                                                                                   field="arrival_rate"),
                          MemoryTarget(1))
    steps = run_ticks(loop, 4)
    assert steps[1].desired > 1
    assert [s.desired for s in steps[2:]] == [steps[1].desired] * 2
    assert steps[3].decision.reason.startswith("hold: metrics unavailable (arrival_rate)")


def test_failed_scale_keeps_the_last_state_and_is_retried():
    spec = keda_spec()
    target = MemoryTarget(1)
    loop = AutoscalerLoop(spec, make_policy(spec), Script([40]), target)
    target.fail_next(2)
    step = loop.tick(1000.0)
    assert step.error and target.current == 1 and loop.pending.desired == step.desired > 1
    assert loop.retry_delay() == 1.0
    assert not loop.retry() and target.current == 1
    assert loop.retry_delay() == 2.0  # backoff doubles
    assert loop.retry() and target.current == step.desired and loop.pending is None


def test_a_restarted_controller_decides_as_an_uninterrupted_one(tmp_path):
    spec = keda_spec()
    queue = [60, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # scale-down waits out a 120 s stabilization window

    def fresh(source, target, state):
        return AutoscalerLoop(spec, make_policy(spec), source, target, state=state)

    whole = fresh(Script(queue), MemoryTarget(1), None)
    reference = [s.desired for s in run_ticks(whole, len(queue))]
    store = StateStore(tmp_path / "state")
    first_target = MemoryTarget(1)
    first = fresh(Script(queue[:4]), first_target, store)
    got = [s.desired for s in run_ticks(first, 4)]
    # killed here (inside the stabilization window); the new process starts from the saved state
    second = fresh(Script(queue[4:]), MemoryTarget(first_target.current), StateStore(tmp_path / "state"))
    got += [s.desired for s in run_ticks(second, len(queue) - 4, start=1000.0 + 4 * 15)]
    assert got == reference
    amnesiac = fresh(Script(queue[4:]), MemoryTarget(first_target.current), None)
    forgot = [s.desired for s in run_ticks(amnesiac, len(queue) - 4, start=1000.0 + 4 * 15)]
    assert forgot != reference[4:]  # without the state it would have scaled down at once: a flap


def test_controller_runs_loops_on_schedule_serves_telemetry_and_stops():
    spec = keda_spec()
    telemetry = Telemetry()
    policy = make_policy(spec)
    policy.polling_interval = 0.2
    loop = AutoscalerLoop(spec, policy, Script([40] * 100), MemoryTarget(1), telemetry=telemetry)
    stop = threading.Event()
    port = telemetry.serve(0, "127.0.0.1")
    ctl = threading.Thread(target=Controller([loop], telemetry=telemetry).run, args=(stop,))
    ctl.start()
    try:
        deadline = time.time() + 5
        while not telemetry.ready_to_serve.is_set() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/healthz").status_code == 200
        assert httpx.get(base + "/readyz").status_code == 200
        page = httpx.get(base + "/metrics").text
        desired = loop.last_step.desired
        assert desired > 1
        assert f'slopilot_autoscaler_desired_replicas{{autoscaler="llama"}} {desired:.1f}' in page
        assert 'slopilot_autoscaler_decisions_total{autoscaler="llama",reason="hpa"}' in page
        assert "slopilot_autoscaler_reconcile_duration_seconds_bucket" in page
    finally:
        stop.set()
        ctl.join(5)
        telemetry.stop()
    assert not ctl.is_alive()
    assert 3 <= loop.source.i <= 8  # ticks every 0.2 s for about a second


def test_spec_files_multi_document_auth_and_skipped_kinds(tmp_path):
    f = tmp_path / "all.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: prom}\nstringData: {token: s3cret}\n---\n"
        "apiVersion: keda.sh/v1alpha1\nkind: TriggerAuthentication\nmetadata: {name: prom-auth}\n"
        "spec:\n  secretTargetRef:\n    - {parameter: bearerToken, name: prom, key: token}\n---\n"
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: llama-70b}\n---\n"
        + KEDA.replace("{fallback}", "")
    )
    loaded = specs.load([tmp_path])
    assert [s.name for s, _ in loaded.specs] == ["llama"]
    assert "prom-auth" in loaded.trigger_auths and loaded.secrets["prom"] == {"token": "s3cret"}
    assert len(loaded.warnings) == 1 and "all.yaml:14: skipped a Deployment" in loaded.warnings[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("---\nkind: ScaledObject\napiVersion: keda.sh/v1alpha1\nmetadata: {name: x}\n"
                   "spec:\n  x: [\n")
    with pytest.raises(ValueError, match=r"bad\.yaml:\d+: invalid YAML"):
        specs.load([bad])


def test_control_once_and_errors_name_the_file(tmp_path, capsys):
    spec_file = tmp_path / "so.yaml"
    spec_file.write_text(KEDA.replace("{fallback}", ""))
    # no Prometheus listens on port 9: the trigger fails, and without fallback the count is held; --once
    # then exits 1 (a source failed: tests/controlplane/test_source_down.py)
    rc = main(["control", "--spec", str(spec_file), "--prometheus", "http://127.0.0.1:9", "--once",
               "--timeout", "0.5", "--decision-log", str(tmp_path / "d.csv")])
    assert rc == 1
    assert "llama: desired 1 (keda: triggers failing, no fallback: no change" in capsys.readouterr().out
    assert "error" in (tmp_path / "d.csv").read_text().splitlines()[1]
    assert main(["control", "--spec", str(tmp_path / "missing.yaml"), "--once"]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_replay_of_a_log_uses_its_own_times():
    text = ("time,queue,current_replicas,desired_replicas,active,reason,scale_error\n"
            "0.5,40,1,8,true,x,\n17.25,40,8,8,true,x,\n")
    rows, _ = read_series(text, ["queue"])
    spec = keda_spec()
    got = replay(make_policy(spec), rows, 15, 1, at_rows=True)
    assert [t for t, _ in got] == [0.5, 17.25]
