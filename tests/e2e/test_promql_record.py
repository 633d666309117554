"""`slopilot record` against a real Prometheus scraping two emulated engines: the recorded series
replays (`slopilot replay`) into the very decisions the live controller took over the same period,
and `replay --prometheus` does both in one step.

The controller ticks on a fixed grid (every 2 s), each tick evaluated by Prometheus at the grid
instant (pin_time) half a second after it, when every scrape up to it is stored; the engines are
under load for the first half of the period and idle after, so the policy scales up and back down."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
import time
from pathlib import Path

from autoscaler.spec import load_spec, make_policy
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog
from controlplane.sources import PrometheusSource
from controlplane.targets.memory import MemoryTarget
from tests.e2e.conftest import SteadyLoad, wait_for

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 2
TICKS = 20
SPEC = f"""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: recorded}}
spec:
  scaleTargetRef: {{name: engines}}
  pollingInterval: {INTERVAL}
  cooldownPeriod: 10
  minReplicaCount: 1
  maxReplicaCount: 10
  advanced:
    horizontalPodAutoscalerConfig:
      behavior: {{scaleDown: {{stabilizationWindowSeconds: 6}}}}
  triggers:
  - type: prometheus
    name: running
    metadata: {{query: "sum(vllm:num_requests_running)", threshold: "2"}}
  - type: prometheus
    name: tokens
    metadata: {{query: "sum(rate(vllm:generation_tokens_total[10s]))", threshold: "40"}}
"""


def slopilot(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "slopilot.cli", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_recorded_series_replays_into_the_live_decisions(emulated_servers, prometheus, tmp_path):
    urls = emulated_servers(2)
    prom = prometheus(urls, scrape_interval=1.0)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    spec = load_spec(SPEC)
    source = PrometheusSource(prom.url, override=True, pin_time=True)
    log = DecisionLog(tmp_path / "live.csv", [t.name for t in spec.triggers])
    loop = AutoscalerLoop(spec, make_policy(spec), source, MemoryTarget(1), log_file=log)
    wait_for(lambda: len(source.query("up == 1")) == 2, 30, what="prometheus scraping both engines")

    t0 = math.ceil(time.time()) + 2
    load = SteadyLoad(urls, rate=12, max_tokens=24, duration=TICKS * INTERVAL / 2).start()
    try:
        for k in range(TICKS):
            tick = t0 + k * INTERVAL
            time.sleep(max(0.0, tick + 0.5 - time.time()))  # scrapes up to the tick are stored by now
            loop.tick(tick)
    finally:
        load.stop()
        log.close()
        source.close()
    assert load.ok > 0 and not load.errors
    live = rows(tmp_path / "live.csv")
    desired = [int(r["desired_replicas"]) for r in live]
    assert len(live) == TICKS and max(desired) > 1 and desired[-1] < max(desired), desired  # up, then down
    assert all(r["running"] not in ("", "error") for r in live)

    end = t0 + (TICKS - 1) * INTERVAL
    slopilot("record", "--prometheus", prom.url, "--spec", str(spec_path), "--start", str(t0),
             "--end", str(end), "-o", str(tmp_path / "recorded.csv"))
    recorded = rows(tmp_path / "recorded.csv")
    assert [float(r["time"]) for r in recorded] == [float(r["time"]) for r in live]
    for name in ("running", "tokens"):  # what KEDA read live is what Prometheus answers for the range
        assert [r[name] for r in recorded] == [r[name] for r in live], name

    slopilot("replay", "--spec", str(spec_path), "--metrics", str(tmp_path / "recorded.csv"),
             "-o", str(tmp_path / "replayed.csv"))
    assert [int(r["desired_replicas"]) for r in rows(tmp_path / "replayed.csv")] == desired

    one_step = slopilot("replay", "--spec", str(spec_path), "--prometheus", prom.url, "--start", str(t0),
                        "--end", str(end))
    assert [int(line.split(",")[1]) for line in one_step.splitlines()[1:]] == desired
