"""Issue 35's smaller items: a spec file is size-checked before it is read (a 300 MB one peaked at
639 MB), a fleet file shares the scenarios' replica limit (100,000 was accepted), and the controller's
metrics address is a flag."""

from __future__ import annotations

import argparse
import resource

import httpx
import pytest

from controlplane import specs
from controlplane.fleet.config import load_fleet_config
from controlplane.telemetry import Telemetry
from routing.config import load_router_config
from slopilot.commands import control


def test_a_huge_spec_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(300 * 2**20)  # 300 MB (sparse: nothing to write)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match=r"big.yaml: 314572800 bytes, more than the limit"):
        specs.load([tmp_path])
    with pytest.raises(ValueError, match="more than the limit"):
        load_router_config(big)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 20  # MB


def test_fleet_replicas_share_the_scenario_limit(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text("name: f\nemulate: h100-llama2-70b-tp4\nreplicas: 100000\nmin_replicas: 1\n")
    with pytest.raises(ValueError, match=r"fleet.yaml:3: replicas: must be <= 10000, got 100000"):
        load_fleet_config(f)


def test_the_controller_metrics_address_is_a_flag():
    p = argparse.ArgumentParser()
    control.add_arguments(p)
    assert p.parse_args(["--metrics-address", "127.0.0.1"]).metrics_address == "127.0.0.1"
    assert p.parse_args([]).metrics_address == "0.0.0.0"  # a pod's probes and Prometheus reach it
    t = Telemetry()
    port = t.serve(0, "127.0.0.1")
    try:
        assert t._server.server_address[0] == "127.0.0.1"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        t.stop()
