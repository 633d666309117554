"""Faults, against real processes: `slopilot control` (a child process, scaling through
--scale-command), a real Prometheus, and a metric the test sets (a prometheus_client gauge that
Prometheus scrapes), so that every decision can be predicted.

* Prometheus stopped mid-run: with a fallback the fallback replicas after failureThreshold failed
  polls, without one the last good decision held; never a drop toward zero; restarted on the same
  port and data, normal decisions resume.
* A scale command that fails the first N times: retried with backoff, the last applied count kept
  meanwhile, then applied.
* The controller SIGKILLed inside a stabilization window and restarted on the same --state-dir: the
  same scale-down time as an uninterrupted controller on the same series, and its concatenated
  decision log replays through one policy to the same decisions row for row.
* An engine killed in a local fleet: the fleet replaces it and the controller logs ready < current.
"""

from __future__ import annotations

import csv
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from controlplane.fleet import load_fleet_config
from controlplane.localrun import LocalRun
from controlplane.prometheus_server import free_port
from tests.e2e.test_control_e2e import (
    MODEL,
    POLL,
    decisions,
    print_timeline,
    query_range,
    read_log,
    replay_cli,
    simulator_step,
    wait_rows,
)

ROOT = Path(__file__).resolve().parents[2]
QUERY = "sum(e2e_demand)"

SCALE = textwrap.dedent("""
    # the scale command: records each call; fails while NAME.fail holds a count above zero
    import sys, time, pathlib
    folder, name, replicas = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    fail = folder / f"{name}.fail"
    left = int(fail.read_text()) if fail.exists() else 0
    with open(folder / f"{name}.calls", "a") as f:
        f.write(f"{time.time():.3f} {replicas} {'fail' if left else 'ok'}\\n")
    if left:
        fail.write_text(str(left - 1))
        sys.exit("injected failure")
    (folder / f"{name}.replicas").write_text(str(replicas))
""")


def scaled_object(name: str, threshold: float = 2.0, min_r: int = 0, max_r: int = 5, window: float = 6.0,
                  fallback: dict | None = None) -> dict:
    spec = {"scaleTargetRef": {"name": name}, "pollingInterval": POLL, "cooldownPeriod": 10,
            "minReplicaCount": min_r, "maxReplicaCount": max_r,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleDown": {"stabilizationWindowSeconds": window}}}},
            "triggers": [{"type": "prometheus", "name": "demand", "metadata": {
                "serverAddress": "http://127.0.0.1:9090", "query": QUERY, "threshold": f"{threshold:g}"}}]}
    if fallback:
        spec["fallback"] = fallback
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
            "spec": spec}


class Demand:
    """The metric the specs scale on: a gauge on a free port, for Prometheus to scrape."""

    def __init__(self, value: float):
        self.registry = CollectorRegistry()
        self.gauge = Gauge("e2e_demand", "replicas' worth of work, set by the test", registry=self.registry)
        self.gauge.set(value)
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.target = f"127.0.0.1:{self.port}"

    def set(self, value: float) -> None:
        self.gauge.set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def demand():
    made = []

    def make(value: float) -> Demand:
        made.append(Demand(value))
        return made[-1]

    yield make
    for d in made:
        d.close()


class Control:
    """`slopilot control` as a child process, scaling through the recording scale command."""

    def __init__(self, folder: Path, specs: list[dict], prometheus: str, metrics_port: int | None = None,
                 extra: tuple[str, ...] = ()):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "specs").mkdir(exist_ok=True)
        for doc in specs:
            (folder / "specs" / f"{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
        (folder / "scale.py").write_text(SCALE)
        scale = f"{sys.executable} {folder / 'scale.py'} {folder} {{name}} {{replicas}}"
        self.cmd = [sys.executable, "-m", "slopilot.cli", "control", "--spec", str(folder / "specs"),
                    "--prometheus", prometheus, "--timeout", "1", "--scale-command", scale,
                    "--state-dir", str(folder / "state"), "--decision-log", str(folder / "{name}.csv")]
        if metrics_port is not None:
            self.cmd += ["--metrics-port", str(metrics_port)]
        self.cmd += list(extra)
        self.metrics_port = metrics_port
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> Control:
        self.runs += 1
        self.err = open(self.folder / f"control-{self.runs}.log", "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.err, stderr=subprocess.STDOUT)
        return self

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.csv"

    def rows(self, name: str) -> list[dict]:
        return read_log(self.log(name)) if self.log(name).exists() else []

    def calls(self, name: str) -> list[tuple[float, int, str]]:
        path = self.folder / f"{name}.calls"
        lines = path.read_text().split("\n") if path.exists() else []
        return [(float(t), int(n), ok) for t, n, ok in (ln.split() for ln in lines if ln)]

    def output(self) -> str:
        return "".join((self.folder / f"control-{i}.log").read_text() for i in range(1, self.runs + 1))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return self.proc.returncode


def wait_series(url: str, query: str = QUERY, timeout: float = 30.0) -> None:
    """Until Prometheus answers `query` with a value (its first scrape happened)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{url}/api/v1/query", params={"query": query}, trust_env=False).json()
        if body["data"]["result"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus has no {query} after {timeout:g} s")


@pytest.fixture
def control():
    started: list[Control] = []

    def make(*args, **kwargs) -> Control:
        started.append(Control(*args, **kwargs))
        return started[-1]

    yield make
    for c in started:
        if c.proc is not None and c.proc.poll() is None:
            c.stop(signal.SIGKILL)


def applied_at(rows: list[dict], replicas: int) -> float | None:
    """Time of the first row whose applied decision is `replicas`."""
    return next((float(r["time"]) for r in rows
                 if not r["scale_error"] and int(r["desired_replicas"]) == replicas), None)


def metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{want}}} not in /metrics")


@pytest.mark.timeout(240)
def test_prometheus_outage_fallback_or_hold_then_resume_and_failed_scales_retried(
        tmp_path, demand, prometheus, control):
    d = demand(4.0)  # 4 / threshold 2 -> 2 replicas
    prom = prometheus([d.target], scrape_interval=1.0)
    wait_series(prom.url)
    threshold = 2
    specs = [scaled_object("with-fallback", fallback={"failureThreshold": threshold, "replicas": 3}),
             scaled_object("no-fallback"),
             scaled_object("flaky-scale")]
    (tmp_path / "ctl").mkdir()
    (tmp_path / "ctl" / "flaky-scale.fail").write_text("3")  # its first three scale calls fail
    port = free_port()
    ctl = control(tmp_path / "ctl", specs, prom.url, metrics_port=port,
                  extra=("--initial-replicas", "1")).start()
    names = [s["metadata"]["name"] for s in specs]
    t0 = time.time()
    try:
        for name in names:
            wait_rows(ctl.log(name), lambda rs: applied_at(rs, 2) is not None, 30, f"{name} at 2")
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", trust_env=False).status_code == 200

        t_stop = time.time()
        prom.stop()
        for name in names:  # failureThreshold failed polls and a few more
            wait_rows(ctl.log(name), lambda rs: sum(float(r["time"]) > t_stop for r in rs) >= threshold + 4,
                      30, f"{name}: polls during the outage")
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200

        t_restart = time.time()
        prom.start()
        t_ready = time.time()
        for name in names:  # resumed: good rows again, and the fallback's 3 back to 2
            wait_rows(ctl.log(name), lambda rs: any(float(r["time"]) > t_ready and r["demand"] == "4.0"
                                                     and int(r["desired_replicas"]) == 2 for r in rs),
                      40, f"{name}: back to 2 after the restart")
        # the restarted server kept its data (same folder): the samples from before the outage are there
        kept = query_range(prom.url, QUERY, t0, t_stop, 1.0)
    finally:
        code = ctl.stop(signal.SIGTERM)
    assert code == 0, ctl.output()[-3000:]
    assert len(kept) >= (t_stop - t0) - 3 and {v for _, v in kept} == {4.0}

    print(f"Prometheus stopped at {t_stop - t0:.1f} s, restarted at {t_restart - t0:.1f} s "
          f"(ready after {t_ready - t_restart:.1f} s)")
    for name in names:
        rows = ctl.rows(name)
        print(f"-- {name}")
        print_timeline(rows, t0, ["demand"])
        outage = [r for r in rows if t_stop < float(r["time"]) < t_ready]
        errors = [r for r in outage if r["demand"] == "error"]
        assert len(errors) >= threshold + 3
        assert all(int(r["desired_replicas"]) >= 2 and int(r["current_replicas"]) >= 2 for r in outage), \
            "never a drop toward zero while the metric is unavailable"
        after = [r for r in rows if float(r["time"]) > t_ready]
        first_good = next(r for r in after if r["demand"] not in ("", "error"))
        print(f"first good read {float(first_good['time']) - t_ready:+.1f} s after Prometheus was ready")
        assert float(first_good["time"]) - t_ready <= 2 * POLL + 1.0

    fb = ctl.rows("with-fallback")
    errors = [r for r in fb if r["demand"] == "error"]
    held = [int(r["desired_replicas"]) for r in errors]
    # KEDA: the fallback once failures exceed failureThreshold; until then the HPA keeps its count
    assert held[:threshold] == [2] * threshold and held[threshold] == 3 and set(held[threshold:]) == {3}
    print(f"with-fallback: {threshold} failed polls held 2, then fallback 3 from failed poll {threshold + 1}")
    back = applied_at([r for r in fb if float(r["time"]) > t_ready], 2)
    print(f"with-fallback back to 2 at {back - t0:.1f} s ({back - t_ready:+.1f} s after the restart)")
    assert all(int(r["desired_replicas"]) == 2 for r in ctl.rows("no-fallback") if r["demand"] == "error")
    assert all("hold" in r["reason"] or "errors: demand" in r["reason"] for r in errors)
    assert metric(page, "slopilot_autoscaler_fallback_active", autoscaler="with-fallback") == 1
    assert metric(page, "slopilot_autoscaler_source_errors_total", autoscaler="no-fallback",
                  metric="demand") >= threshold + 3
    assert metric(page, "slopilot_autoscaler_desired_replicas", autoscaler="with-fallback") == 3

    # the failing scale: retried with backoff between ticks, the last applied count kept meanwhile
    calls = ctl.calls("flaky-scale")
    print("flaky-scale calls:", [(round(t - t0, 1), n, ok) for t, n, ok in calls[:6]])
    assert [ok for _, _, ok in calls[:4]] == ["fail", "fail", "fail", "ok"] and calls[3][1] == 2
    assert calls[3][0] - calls[0][0] <= 3 * POLL  # not a poll lost per failure
    flaky = ctl.rows("flaky-scale")
    failed = [r for r in flaky if r["scale_error"]]
    assert failed and all(int(r["current_replicas"]) == 1 and "injected failure" in r["scale_error"]
                          for r in failed)
    assert (tmp_path / "ctl" / "flaky-scale.replicas").read_text() == "2"
    # three failures over two or three ticks: a retry between the first two, then the backoff (4 s)
    # outlasts a poll and the next tick's own scale call goes through
    assert 2 <= len(failed) <= 3

    for name in names:  # one policy, three places: the outage and the failed scales included
        spec_path = tmp_path / "ctl" / "specs" / f"{name}.yaml"
        live = decisions(ctl.rows(name))
        assert decisions(replay_cli(spec_path, ctl.log(name))) == live
        assert simulator_step(spec_path, ctl.log(name)) == live
    print("decision logs identical in `slopilot replay` and the simulator step")


@pytest.mark.timeout(240)
def test_controller_sigkilled_inside_the_window_resumes_like_an_uninterrupted_one(
        tmp_path, demand, prometheus, control):
    d = demand(6.0)  # 6 / threshold 2 -> 3 replicas
    prom = prometheus([d.target], scrape_interval=1.0)
    wait_series(prom.url)
    window = 20.0
    spec = scaled_object("restart", min_r=1, window=window)
    killed = control(tmp_path / "killed", [spec], prom.url)
    reference = control(tmp_path / "reference", [spec], prom.url)  # same series, never interrupted
    t0 = time.time()
    killed.start()
    reference.start()
    try:
        for c in (killed, reference):
            wait_rows(c.log("restart"), lambda rs: applied_at(rs, 3) is not None, 30, "scaled to 3")
        t_drop = time.time()
        d.set(2.0)  # 1 replica's worth: the scale-down waits the 20-s stabilization window
        wait_rows(killed.log("restart"), lambda rs: sum(float(r["time"]) > t_drop + 1 for r in rs) >= 3, 20,
                  "three polls after the drop")
        t_kill = time.time()
        killed.proc.send_signal(signal.SIGKILL)
        assert killed.proc.wait(10) == -signal.SIGKILL
        killed.err.close()
        time.sleep(2.0)
        t_restart = time.time()
        killed.start()  # same --state-dir, same decision log (appended)
        for c in (killed, reference):
            wait_rows(c.log("restart"), lambda rs: applied_at([r for r in rs if float(r["time"]) > t_drop], 1)
                      is not None, 60, "scaled down to 1")
    finally:
        codes = [c.stop(signal.SIGTERM) for c in (killed, reference)]
    assert codes == [0, 0], killed.output()[-3000:]

    rows = killed.rows("restart")
    print_timeline(rows, t0, ["demand"])
    down = {name: applied_at([r for r in c.rows("restart") if float(r["time"]) > t_drop], 1)
            for name, c in (("killed", killed), ("reference", reference))}
    print(f"demand dropped at {t_drop - t0:.1f} s; controller SIGKILLed at {t_kill - t0:.1f} s, restarted at "
          f"{t_restart - t0:.1f} s; scaled down at {down['killed'] - t0:.1f} s (restarted) and "
          f"{down['reference'] - t0:.1f} s (uninterrupted), window {window:g} s after the drop")
    assert t_restart < t_drop + window - 2 * POLL  # the restart fell inside the window
    assert window - POLL <= down["killed"] - t_drop <= window + 2 * POLL + 1.0
    assert abs(down["killed"] - down["reference"]) <= POLL + 1.0  # the two differ only by their poll phase
    # the same scale calls: no flap to 1 at the restart, and no scale to 3 again (it knew it was at 3)
    calls = [[n for _, n, _ in c.calls("restart")] for c in (killed, reference)]
    assert calls == [[3, 1], [3, 1]]

    # the concatenated log (both processes) replays through one policy to the same decisions
    spec_path = tmp_path / "killed" / "specs" / "restart.yaml"
    live = decisions(rows)
    assert decisions(replay_cli(spec_path, killed.log("restart"))) == live
    assert simulator_step(spec_path, killed.log("restart")) == live
    # and the saved state is what made them equal: the restarted rows alone, through a fresh policy,
    # scale down at once
    after = [r for r in rows if float(r["time"]) > t_restart]
    alone = tmp_path / "after_restart.csv"
    with open(alone, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(after)
    fresh = decisions(replay_cli(spec_path, alone))
    print(f"after the restart: live {[x[0] for x in decisions(after)][:6]}, a fresh policy "
          f"{[x[0] for x in fresh][:6]}")
    assert decisions(after)[0][0] == 3 and fresh[0][0] == 1


@pytest.mark.timeout(180)
def test_engine_killed_is_replaced_while_scales_beyond_the_fleet_fail(tmp_path):
    # the spec asks for 3 replicas (its minimum) of a fleet that allows 2: every scale fails and is retried,
    # the fleet keeps its 2; meanwhile an engine is SIGKILLed
    spec = scaled_object("beyond", min_r=3, max_r=4)
    hold = 6.0  # seconds a new replica answers /health 503, as while a real server loads its weights
    spec["spec"]["triggers"][0]["metadata"].update(query="sum(vllm:num_requests_waiting)", threshold="4")
    cfg = load_fleet_config({"name": "faults", "emulate": MODEL, "replicas": 2, "min_replicas": 1,
                             "max_replicas": 2, "drain_timeout": 5, "start_timeout": 60, "scrape_interval": 1,
                             "engine": {"health_hold": hold}, "autoscaler": spec})
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("slopilot.control").addHandler(handler)
    with LocalRun(cfg, tmp_path, rate_window=10.0, with_load=False) as run:
        t0 = run.started
        log = tmp_path / "decisions.csv"
        wait_rows(log, lambda rs: len(rs) >= 3, 30, "three reconciles")
        victim = run.fleet.processes()["r1"]
        t_kill = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        rows = wait_rows(log, lambda rs: any(float(r["time"]) > t_kill and int(r["ready_replicas"]) < 2
                                             for r in rs), 30, "a reconcile that sees ready < current")
        assert run.fleet.wait_until_ready(60)
        t_ready = time.time()
        rows = wait_rows(log, lambda rs: float(rs[-1]["time"]) > t_ready + POLL, 30, "reconciles after it")
        events = list(run.fleet.events)
        scale_errors = run.telemetry.registry.get_sample_value("slopilot_autoscaler_scale_errors_total",
                                                               {"autoscaler": "beyond"})
    logging.getLogger("slopilot.control").removeHandler(handler)
    print_timeline(rows, t0, ["demand"])
    died = [e for e in events if e["event"] == "died"]
    ready = [e for e in events if e["event"] == "ready" and e["time"] > t_kill]
    print(f"r1 SIGKILLed at {t_kill - t0:.1f} s; died noticed at {died[0]['time'] - t0:.1f} s; "
          f"replacement {ready[0]['replica']} ready at {ready[0]['time'] - t0:.1f} s; {int(scale_errors)} "
          f"failed scale calls over {len(rows)} reconciles")
    assert [e["replica"] for e in died] == ["r1"] and ready[0]["replica"] == "r3"
    seen = [r for r in rows if t_kill < float(r["time"]) < ready[0]["time"]]
    assert len(seen) >= 2 and all(int(r["ready_replicas"]) == 1 and int(r["current_replicas"]) == 2
                                  and int(r["starting_replicas"]) == 1 for r in seen)
    assert ready[0]["after_s"] >= hold
    assert int(rows[-1]["ready_replicas"]) == int(rows[-1]["current_replicas"]) == 2
    # every reconcile asked for 3, failed on the fleet's bound, and the fleet kept 2
    assert all(int(r["desired_replicas"]) == 3 and "outside [1, 2]" in r["scale_error"]
               and int(r["current_replicas"]) == 2 for r in rows)
    # each tick tries again; between ticks a retry only while the backoff (1 s, doubling, kept across
    # ticks while the same count fails) is shorter than the poll: the first one or two
    retries = [m for m in messages if "failed again" in m]
    print(f"{len(retries)} retries between ticks: {retries}")
    assert len(rows) >= 6 and 1 <= len(retries) <= 2
    assert scale_errors >= len(rows) - 1 + len(retries)
