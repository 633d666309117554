"""A down metric source is said, once and clearly (issue: against a Prometheus that does not answer,
`control --dry-run --once` printed `desired 1 (hpa: FailedGetMetrics (errors: ...))` and exited 0;
running, the only line was `scale 1 -> 5: hpa: ScaleUpLimit (errors: ...)`; /readyz stayed 200).
Now: the first failure logs the URL and the error at warning, the recovery at info; a fallback's start
and end are logged with the replicas; /readyz fails after N failed polls with the reason while
/healthz stays up; `control --once` exits 1."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx

from autoscaler import load_spec, make_policy
from controlplane.controller import AutoscalerLoop, Controller
from controlplane.sources.prometheus import PrometheusSource
from controlplane.targets import MemoryTarget
from controlplane.telemetry import Telemetry
from slopilot.cli import main
from tests.controlplane.test_cp_controller import Script, run_ticks

SPEC = """apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama}
spec:
  scaleTargetRef: {name: llama-70b}
  pollingInterval: 1
  minReplicaCount: 1
  maxReplicaCount: 10
  fallback: {failureThreshold: 1, replicas: 5}
  triggers:
    - type: prometheus
      name: queue
      metadata: {query: "sum(vllm:num_requests_waiting)", threshold: "5"}
"""


def dead_url() -> str:
    """An address where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Flaky(Script):
    """A real Prometheus source on a dead port for the first `down` polls, then the scripted values."""

    def __init__(self, url: str, down: int, values):
        super().__init__(values)
        self.real, self.down, self.polls = PrometheusSource(url, override=True), down, 0
        self.url = url
        self.last_errors = {}

    def observe(self, spec, now, current, ready=None):
        self.polls += 1
        if self.polls <= self.down:
            obs = self.real.observe(spec, now, current, ready)
            self.last_errors = self.real.last_errors
            return obs
        self.last_errors = {}
        return super().observe(spec, now, current, ready)


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "slopilot.control"]


def test_the_first_failure_and_the_recovery_are_logged_once_with_the_url(caplog):
    url = dead_url()
    spec = load_spec(SPEC)
    loop = AutoscalerLoop(spec, make_policy(spec), Flaky(url, 3, [0]), MemoryTarget(2))
    with caplog.at_level(logging.INFO, logger="slopilot.control"):
        run_ticks(loop, 5)
    warnings = [m for m in messages(caplog, logging.WARNING) if "metric source" in m]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"llama: metric source prometheus {url} failing: trigger 'queue': "
                                  f"prometheus at {url}: ConnectionError")
    assert "Connection refused" in warnings[0]
    recovered = f"llama: metric source prometheus {url} recovered after 3 failed poll(s)"
    assert recovered in messages(caplog, logging.INFO)


def test_a_fallback_logs_its_start_and_end_with_the_replicas(caplog):
    spec = load_spec(SPEC)
    loop = AutoscalerLoop(spec, make_policy(spec), Flaky(dead_url(), 3, [0]), MemoryTarget(2))
    with caplog.at_level(logging.INFO, logger="slopilot.control"):
        steps = run_ticks(loop, 5)
    started = [m for m in messages(caplog, logging.WARNING) if "fallback started" in m]
    ended = [m for m in messages(caplog, logging.INFO) if "fallback ended" in m]
    assert started == ["llama: fallback started: 5 replicas (fallback.replicas, behavior static); desired 4 "
                       "now (hpa: ScaleUpLimit (errors: queue))"]
    assert [s.desired for s in steps][:4] == [2, 4, 5, 5]  # the fallback counts after failureThreshold
    assert ended == ["llama: fallback ended: 5 replicas (hpa: DesiredWithinRange)"]


def test_readyz_says_the_source_is_down_after_n_polls_while_healthz_stays_up():
    spec = load_spec(SPEC)
    telemetry = Telemetry()
    telemetry.down_after_polls = 2
    url = dead_url()
    loop = AutoscalerLoop(spec, make_policy(spec), PrometheusSource(url, override=True, timeout=0.5),
                          MemoryTarget(2), telemetry=telemetry)
    port = telemetry.serve(0, host="127.0.0.1")
    stop = threading.Event()
    ctl = Controller([loop], telemetry=telemetry)
    thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while loop.health.failed_polls < 2 and time.time() < deadline:
            time.sleep(0.1)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        stop.set()
        thread.join(10)
        telemetry.stop()
    assert health.status_code == 200
    assert ready.status_code == 503
    assert ready.text.startswith(f"not ready\nllama: metric source prometheus {url} down for ")
    assert "Connection refused" in ready.text


def test_control_once_exits_1_naming_the_source(tmp_path, capsys):
    (tmp_path / "so.yaml").write_text(SPEC)
    url = dead_url()
    assert main(["control", "--spec", str(tmp_path / "so.yaml"), "--prometheus", url, "--once",
                 "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert f"llama: metric source prometheus {url} failed: trigger 'queue': prometheus at {url}" in err
    assert "Connection refused" in err
