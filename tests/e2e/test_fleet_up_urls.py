"""`fleet up` says where its parts listen (issue: its Prometheus and router were found with `ss`): the
Prometheus, the router, the controller's /metrics and the dashboard, each URL answering."""

from __future__ import annotations

import httpx
import pytest

from controlplane.fleet import load_fleet_config
from controlplane.localrun import LocalRun
from slopilot.cli import main

SPEC = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "q"},
        "spec": {"scaleTargetRef": {"name": "e2e"}, "pollingInterval": 2, "minReplicaCount": 1,
                 "maxReplicaCount": 1,
                 "triggers": [{"type": "prometheus", "name": "queue",
                               "metadata": {"query": "sum(vllm:num_requests_waiting)", "threshold": "4"}}]}}
FLEET = {"name": "e2e", "emulate": "h100-llama2-70b-tp4", "replicas": 1, "min_replicas": 1, "max_replicas": 1,
         "drain_timeout": 2, "scrape_interval": 1, "autoscaler": SPEC, "router": True}


@pytest.mark.timeout(180)
def test_every_printed_url_answers(tmp_path):
    with LocalRun(load_fleet_config(FLEET), tmp_path, with_load=False) as run:
        urls = run.urls()
        assert set(urls) == {"prometheus", "router", "controller metrics", "replicas", "dashboard"}
        assert httpx.get(urls["prometheus"] + "/-/ready", timeout=10, trust_env=False).status_code == 200
        assert httpx.get(urls["router"] + "/health", timeout=10, trust_env=False).status_code in (200, 503)
        metrics = urls["controller metrics"].split(" ")[0]
        page = httpx.get(metrics, timeout=10, trust_env=False)
        assert page.status_code == 200 and "slopilot_autoscaler_desired_replicas" in page.text


@pytest.mark.timeout(180)
def test_fleet_up_prints_them(tmp_path, capsys):
    import yaml

    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    assert main(["fleet", "up", str(tmp_path / "fleet.yaml"), "--out", str(tmp_path / "out"),
                 "--duration", "3", "--no-dashboard"]) == 0
    err = capsys.readouterr().err
    for line in ("  prometheus: http://127.0.0.1:", "  router: http://127.0.0.1:",
                 "  controller metrics: http://127.0.0.1:", "  dashboard: this terminal, and "):
        assert line in err, err
