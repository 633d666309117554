"""A policy type is declared once: tests/autoscaler/toy_policy.py registers `toyQueue` in that one module (no
edit anywhere else), and the schema, the CRD, the reference page, the metric sources, `slopilot
replay`, `slopilot simulate` and `slopilot control --once` all take it."""

from __future__ import annotations

import csv
import http.server
import importlib.util
import threading
from pathlib import Path

import pytest

from autoscaler.crd import crd
from autoscaler.export import to_scaled_object
from autoscaler.registry import PolicyType, lookup, register, registered, unregister
from autoscaler.spec import load_spec, make_policy
from controlplane.sources.base import needed
from slopilot.cli import main
from tests.autoscaler import toy_policy

# importing it registered toyQueue while pytest collected this file: only this file's tests (the
# fixture below) may see it, not the CRD and schema tests collected beside it
unregister("toyQueue")

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: toy}
spec:
  scaleTargetRef: {name: llama}
  minReplicas: 1
  maxReplicas: 8
  pollingInterval: 10
  policy:
    type: toyQueue
    toyQueue: {queuePerReplica: 5}
"""


@pytest.fixture(autouse=True)
def toy():
    register(toy_policy.TOY)  # imported above; registered again after a test took it out
    yield toy_policy.TOY
    unregister("toyQueue")  # other test files see only the built-in types


def test_the_schema_takes_it_and_checks_its_options():
    spec = load_spec(SPEC, "toy.yaml")
    assert spec.policy_type == "toyQueue" and spec.config == toy_policy.ToyOptions(per_replica=5)
    assert load_spec(SPEC.replace("    toyQueue: {queuePerReplica: 5}\n", "")).config.per_replica == 4.0
    where = r"toy\.yaml:11: spec\.policy\.toyQueue\.queuePerReplica"
    with pytest.raises(ValueError, match=where + ": must be > 0"):
        load_spec(SPEC.replace("queuePerReplica: 5", "queuePerReplica: 0"), "toy.yaml")
    with pytest.raises(ValueError, match=r"spec\.policy\.toyQueue\.perReplica: unknown field"):
        load_spec(SPEC.replace("queuePerReplica", "perReplica"))
    unregister("toyQueue")
    builtin = "keda, hpa, ratio, sloModel, kpa, pdModel"
    with pytest.raises(ValueError, match=rf"spec\.policy\.type: must be one of {builtin}, got 'toyQueue'"):
        load_spec(SPEC)


def test_it_appears_in_the_crd_and_the_reference():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    policy = schema["properties"]["spec"]["properties"]["policy"]["properties"]
    assert policy["type"]["enum"][-1] == "toyQueue"
    assert policy["toyQueue"]["properties"]["queuePerReplica"]["default"] == 4.0
    gen = importlib.util.spec_from_file_location("generate", ROOT / "docs" / "guide" / "generate.py")
    page = importlib.util.module_from_spec(gen)
    gen.loader.exec_module(page)
    text = page.spec_page()
    assert "| `spec.policy.toyQueue.queuePerReplica` | number | > 0 | `4.0` | waiting requests one replica " \
        "absorbs |" in text
    assert ("`spec.policy.type` | one of `keda`, `hpa`, `ratio`, `sloModel`, `kpa`, `pdModel`, "
            "`toyQueue`") in text


def test_the_sources_read_what_it_declares_and_a_bad_registration_is_refused():
    assert needed(load_spec(SPEC), None) == ("num_waiting",)
    assert needed(load_spec(SPEC.replace("type: toyQueue", "type: kpa").replace(
        "    toyQueue: {queuePerReplica: 5}\n", "")), None) == ("arrival_rate", "num_running", "num_waiting")
    with pytest.raises(ValueError, match="registered already"):
        register(PolicyType("toyQueue", toy_policy.build, reads=(), options=toy_policy.ToyOptions))
    with pytest.raises(ValueError, match="reads unknown aggregates"):
        register(PolicyType("toyTwo", toy_policy.build, reads=("queue",), options=toy_policy.ToyOptions))
    assert [pt.name for pt in registered()] == ["keda", "hpa", "ratio", "sloModel", "kpa", "pdModel",
                                                "toyQueue"]
    assert lookup("toyQueue") is toy_policy.TOY
    assert isinstance(make_policy(load_spec(SPEC)), toy_policy.ToyQueuePolicy)


def test_export_says_it_has_no_keda_equivalent():
    why = "spec.policy.type: toyQueue has no KEDA equivalent: its registration gives no translation"
    with pytest.raises(ValueError, match=why):
        to_scaled_object(load_spec(SPEC))


def test_replay(tmp_path):
    (tmp_path / "toy.yaml").write_text(SPEC)
    (tmp_path / "series.csv").write_text("time,num_waiting\n0,0\n10,12\n20,31\n30,\n")
    assert main(["replay", "--spec", str(tmp_path / "toy.yaml"), "--metrics", str(tmp_path / "series.csv"),
                 "-o", str(tmp_path / "out.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [(r["desired_replicas"], r["reason"]) for r in rows] == [
        ("1", "toyQueue: 0 waiting -> 1"), ("3", "toyQueue: 12 waiting -> 3"),
        ("7", "toyQueue: 31 waiting -> 7"), ("7", "toyQueue: no queue, no change")]


SCENARIO = """\
name: toy
seed: 1
duration: 600
workload:
  arrivals: {rate: 6}
  prompt_tokens: 1000
  output_tokens: 200
pools:
  - name: h100
    latency_model: h100-llama2-70b-tp4
    replicas: 1
    kv_blocks: 4000
    provisioning_delay: 30
    autoscaler:
      spec:
""" + "".join(f"        {line}\n" for line in SPEC.splitlines())


def test_simulate(tmp_path):
    (tmp_path / "toy.yaml").write_text(SCENARIO)
    assert main(["simulate", str(tmp_path / "toy.yaml"), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    timeline = list(csv.DictReader((tmp_path / "out" / "timeline.csv").open()))
    desired = [int(r["desired"]) for r in timeline]
    # one replica queues at 6 req/s; the toy adds one per 5 waiting, up to its maximum of 8
    assert desired[0] == 1 and max(desired) == 8 and max(int(r["ready"]) for r in timeline) > 1


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 12.0\n'
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_control_once(tmp_path, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "toy.yaml").write_text(SPEC)
        rc = main(["control", "--spec", str(tmp_path / "toy.yaml"), "--once", "--engine", "vllm", "--scrape",
                   f"http://127.0.0.1:{server.server_address[1]}/metrics", "--timeout", "2"])
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 0
    assert "toy: desired 3 (toyQueue: 12 waiting -> 3)" in capsys.readouterr().out
