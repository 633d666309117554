"""A relative data folder (as `demo --live --out out/demo` gives) still starts Prometheus, which runs
with that folder as its working directory."""

import httpx

from controlplane.prometheus_server import PrometheusServer


def test_relative_data_dir_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with PrometheusServer([], data_dir="out/demo/prometheus") as prom:
        assert prom.dir == tmp_path / "out" / "demo" / "prometheus"
        assert httpx.get(prom.url + "/-/ready", timeout=5, trust_env=False).status_code == 200
