"""Scorers and pickers are registered once (routing.scorers, routing.pickers): the toy ones of
tests/routing/toy_router_plugins.py, registered in that one module, work in the simulated router (a scenario's
router block), in the router's EndpointPickerConfig and in `slopilot route`."""

from __future__ import annotations

import csv
import http.server
import json
import threading
import time

import httpx
import pytest
import yaml

from controlplane.prometheus_server import free_port
from controlplane.router import httpserver
from routing.config import load_router_config
from routing.router import Router
from routing.scorers import SCORER_PLUGINS
from slopilot.cli import main
from tests.routing import toy_router_plugins

# importing it registered the toy plugins at collection: only this file's tests (the fixture) see them
toy_router_plugins.unregister()


@pytest.fixture(autouse=True)
def toys():
    if "fullest" not in SCORER_PLUGINS:
        toy_router_plugins.register()
    yield
    toy_router_plugins.unregister()  # other test files see only the built-in plugins


class View:
    def __init__(self, id, outstanding=0, num_waiting=0, num_running=0, kv_usage=0.0):
        self.id, self.outstanding, self.num_waiting = id, outstanding, num_waiting
        self.num_running, self.kv_usage = num_running, kv_usage


def test_the_router_looks_them_up():
    reps = [View(3, outstanding=2, kv_usage=0.2), View(1, outstanding=1, kv_usage=0.5), View(2)]
    assert Router("weighted", {"fullest": 1.0}).pick(reps) == 1  # the fullest cache
    assert Router("weighted", {"kv": 1.0}).pick(reps) == 2  # the built-in kv scorer: the emptiest
    assert Router("last").pick(reps) == 2
    assert Router("least_outstanding").pick(reps) == 2  # the built-ins are looked up the same way
    with pytest.raises(ValueError, match="unknown router policy 'nope'"):
        Router("nope")
    with pytest.raises(ValueError, match="unknown scorer"):
        Router("weighted", {"nope": 1.0})
    with pytest.raises(ValueError, match="registered already"):
        toy_router_plugins.register()


SCENARIO = """\
name: toy-router
seed: 2
duration: 60
workload:
  arrivals: {rate: 4}
  prompt_tokens: 200
  output_tokens: 50
pools:
  - name: h100
    latency_model: h100-llama2-70b-tp4
    replicas: 3
    kv_blocks: 4000
router: ROUTER
"""


def _replicas_used(tmp_path, router: str) -> set[str]:
    out = tmp_path / router.replace(" ", "").replace(":", "").replace("{", "").replace("}", "")
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("ROUTER", router))
    assert main(["simulate", str(tmp_path / "s.yaml"), "--out", str(out), "--no-plots"]) == 0
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) > 150
    return {r["replica"] for r in rows}


def test_simulate_takes_them(tmp_path):
    assert len(_replicas_used(tmp_path, "{policy: least_outstanding}")) == 3
    # packed: the first replica to take a request has the fullest cache from then on
    assert len(_replicas_used(tmp_path, "{policy: weighted, weights: {fullest: 1}}")) == 1
    assert _replicas_used(tmp_path, "{policy: last}") == {"2"}
    toy_router_plugins.unregister()
    bad = SCENARIO.replace("ROUTER", "{policy: weighted, weights: {fullest: 1}}")
    (tmp_path / "bad.yaml").write_text(bad)
    assert main(["simulate", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "bad")]) == 2


ROUTER_YAML = """\
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: fullest-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: fullest-cache-scorer, weight: 1}, {pluginRef: max-score-picker}]
dataLayer: {refreshInterval: 50ms}
"""


def test_the_router_config_takes_them():
    cfg = load_router_config(yaml.safe_load(ROUTER_YAML))
    assert (cfg.policy, cfg.weights) == ("weighted", {"fullest": 1.0})
    cfg = load_router_config({"kind": "EndpointPickerConfig", "plugins": [{"type": "last-endpoint-picker"}]})
    assert cfg.policy == "last"


class Engine(http.server.BaseHTTPRequestHandler):
    """A stand-in engine: an idle vLLM /metrics page with its own KV usage, /health, and completions
    it counts."""

    served: dict[int, int] = {}
    kv: dict[int, float] = {}

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/metrics"):
            kv = Engine.kv[self.server.server_address[1]]
            page = (f'vllm:num_requests_waiting{{model_name="m"}} 0\n'
                    f'vllm:num_requests_running{{model_name="m"}} 0\n'
                    f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n')
            self._send(page.encode(), "text/plain")
        else:
            self._send(b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        port = self.server.server_address[1]
        Engine.served[port] = Engine.served.get(port, 0) + 1
        self._send(json.dumps({"id": "x", "object": "text_completion", "model": "m",
                               "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                         "total_tokens": 2}}).encode())

    def log_message(self, *args):
        pass


def test_slopilot_route_takes_them(tmp_path, monkeypatch):
    engines = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine) for _ in range(3)]
    for e, kv in zip(engines, (0.1, 0.5, 0.3)):
        Engine.kv[e.server_address[1]] = kv
        threading.Thread(target=e.serve_forever, daemon=True).start()
    servers = []
    run = httpserver.HttpServer.run
    monkeypatch.setattr(httpserver.HttpServer, "run", lambda self: (servers.append(self), run(self))[1])
    (tmp_path / "router.yaml").write_text(ROUTER_YAML)
    port = free_port()
    argv = ["route", "-c", str(tmp_path / "router.yaml"), "--port", str(port)]
    for e in engines:
        argv += ["--endpoint", f"http://127.0.0.1:{e.server_address[1]}"]
    thread = threading.Thread(target=main, args=(argv,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        time.sleep(0.3)  # a few metric refreshes
        Engine.served.clear()
        for _ in range(12):
            body = {"model": "m", "prompt": "hello", "max_tokens": 1}
            r = httpx.post(url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
        # every request to the fullest cache (0.5): the toy scorer decided; the built-in kv scorer would
        # have sent them to the emptiest (0.1)
        assert Engine.served == {engines[1].server_address[1]: 12}
    finally:
        for s in servers:
            s.should_exit = True
        thread.join(timeout=15)
        for e in engines:
            e.shutdown()
            e.server_close()
