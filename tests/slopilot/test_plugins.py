"""A user's own policy type, scorer or picker, loaded into a real `slopilot` process: `slopilot --plugin
MODULE` (repeatable) or SLOPILOT_PLUGINS=mod1,mod2, imported before the subcommand runs (slopilot.plugins).
Each test starts a separate process with the toy modules of tests/autoscaler/toy_policy.py and
tests/routing/toy_router_plugins.py, which the process imports nowhere else; without the plugin the
same command fails on the unknown type."""

from __future__ import annotations

import csv
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.autoscaler.test_policy_registry import SCENARIO as TOY_SCENARIO
from tests.autoscaler.test_policy_registry import SPEC as TOY_SPEC
from tests.fake_engine import FakeEngine
from tests.routing.test_router_registry import ROUTER_YAML
from tests.routing.test_router_registry import SCENARIO as ROUTER_SCENARIO
from tests.server_helpers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOY_POLICY = "tests.autoscaler.toy_policy"
TOY_ROUTER = "tests.routing.toy_router_plugins"


def slopilot(*argv: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 120,
             runner: list[str] | None = None) -> subprocess.CompletedProcess:
    """`slopilot ARGV` in a new process of this checkout (PYTHONPATH: the repository)."""
    full_env = {k: v for k, v in os.environ.items() if k != "SLOPILOT_PLUGINS"}
    full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([*(runner or [sys.executable, "-m", "slopilot.cli"]), *argv], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def test_replay_takes_the_toy_policy_from_the_flag(tmp_path):
    (tmp_path / "toy.yaml").write_text(TOY_SPEC)
    (tmp_path / "series.csv").write_text("time,num_waiting\n0,0\n10,12\n20,31\n")
    args = ["replay", "--spec", str(tmp_path / "toy.yaml"), "--metrics", str(tmp_path / "series.csv"),
            "-o", str(tmp_path / "out.csv")]
    without = slopilot(*args)
    assert without.returncode == 2 and "toyQueue" in without.stderr  # not a type this process knows
    p = slopilot("--plugin", TOY_POLICY, *args)
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [(r["desired_replicas"], r["reason"]) for r in rows] == [("1", "toyQueue: 0 waiting -> 1"),
                                                                    ("3", "toyQueue: 12 waiting -> 3"),
                                                                    ("7", "toyQueue: 31 waiting -> 7")]


def test_simulate_takes_the_toy_policy_from_the_environment(tmp_path):
    (tmp_path / "toy.yaml").write_text(TOY_SCENARIO.replace("duration: 600", "duration: 300"))
    p = slopilot("simulate", str(tmp_path / "toy.yaml"), "--out", str(tmp_path / "out"), "--no-plots",
                 env={"SLOPILOT_PLUGINS": f"{TOY_ROUTER}, {TOY_POLICY}"})
    assert p.returncode == 0, p.stderr
    timeline = list(csv.DictReader((tmp_path / "out" / "timeline.csv").open()))
    desired = [int(r["desired"]) for r in timeline]
    # one replica queues at 6 req/s; the toy adds one per 5 waiting, up to its maximum of 8
    assert desired[0] == 1 and max(desired) == 8 and max(int(r["ready"]) for r in timeline) > 1


@pytest.mark.parametrize("router,used", [
    ("{policy: weighted, weights: {fullest: 1}}", 1), ("{policy: last}", {"2"}),
    ("{policy: weighted, weights: {kv: 1}}", 3),
])
def test_simulate_takes_the_toy_scorer_and_picker(tmp_path, router, used):
    (tmp_path / "s.yaml").write_text(ROUTER_SCENARIO.replace("ROUTER", router))
    p = slopilot("--plugin", TOY_ROUTER, "simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"),
                 "--no-plots")
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "requests.csv").open()))
    # the fullest KV cache packs every request on one replica, the last picker on the last; the built-in
    # kv scorer (the emptiest) spreads them
    replicas = {r["replica"] for r in rows}
    assert len(rows) > 150 and (replicas == used if isinstance(used, set) else len(replicas) == used)


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'vllm:num_requests_waiting{model_name="m"} 12.0\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_control_once_takes_the_toy_policy(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "toy.yaml").write_text(TOY_SPEC)
    try:
        p = slopilot(f"--plugin={TOY_POLICY}", "control", "--spec", str(tmp_path / "toy.yaml"), "--once",
                     "--engine", "vllm", "--scrape", f"http://127.0.0.1:{server.server_address[1]}/metrics",
                     "--timeout", "2")
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 0, p.stderr
    assert "toy: desired 3 (toyQueue: 12 waiting -> 3)" in p.stdout


def test_route_takes_the_toy_scorer(tmp_path):
    engines = [FakeEngine().start() for _ in range(3)]
    for e, kv in zip(engines, ("0.1", "0.5", "0.3")):
        e.kv = kv
    (tmp_path / "router.yaml").write_text(ROUTER_YAML)
    port = free_port()
    argv = [sys.executable, "-m", "slopilot.cli", "--plugin", TOY_ROUTER, "route", "-c",
            str(tmp_path / "router.yaml"), "--port", str(port)]
    for e in engines:
        argv += ["--endpoint", e.url]
    env = {k: v for k, v in os.environ.items() if k != "SLOPILOT_PLUGINS"}
    proc = subprocess.Popen(argv, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_for(healthy, timeout=60), proc.stdout.read() if proc.poll() is not None else "no /health"
        time.sleep(0.3)  # a few metric refreshes
        before = [e.served for e in engines]
        for _ in range(12):
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1},
                           timeout=10)
            assert r.status_code == 200, r.text
        # every request to the fullest cache (0.5): the toy scorer decided in the separate process
        assert [e.served - b for e, b in zip(engines, before)] == [0, 12, 0]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        for e in engines:
            e.stop()


def test_a_plugin_in_the_current_folder_is_found_by_an_entry_point_script(tmp_path):
    """A console script's import path holds its own folder, not the current one: the loader adds it."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "slopilot").write_text("import sys\nfrom slopilot.cli import main\n"
                                               "sys.exit(main())\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "my_scorer.py").write_text(
        "from routing.scorers import register_scorer\n"
        "register_scorer('emptiest', 'emptiest-scorer', lambda reps, ctx: [1 - r.kv_usage for r in reps])\n")
    (tmp_path / "work" / "router.yaml").write_text(
        "kind: EndpointPickerConfig\nplugins: [{type: emptiest-scorer}, {type: max-score-picker}]\n")
    text = TOY_SCENARIO.split("    autoscaler:")[0] + "router: router.yaml\n"
    (tmp_path / "work" / "s.yaml").write_text(text.replace("duration: 600", "duration: 20"))
    runner = [sys.executable, str(tmp_path / "bin" / "slopilot")]
    args = ["simulate", "s.yaml", "--out", "out", "--no-plots"]
    without = slopilot(*args, cwd=tmp_path / "work", runner=runner)
    assert without.returncode == 2 and "emptiest-scorer" in without.stderr
    p = slopilot("--plugin", "my_scorer", *args, cwd=tmp_path / "work", runner=runner)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("module,env,error", [
    ("no_such_module", None, "slopilot: error: plugin 'no_such_module' (--plugin): no module named "
                             "'no_such_module' on the import path"),
    (None, "tests.autoscaler.toy_policy,,nope.deeper", "slopilot: error: plugin 'nope.deeper' "
                                                       "(SLOPILOT_PLUGINS): no module named 'nope'"),
    ("broken", None, "slopilot: error: plugin 'broken' (--plugin) failed to import: ValueError: "
                     "scorer 'queue' is registered already"),
    ("needs_dep", None, "slopilot: error: plugin 'needs_dep' (--plugin) failed to import: No module named "
                        "'some_missing_dependency'"),
    ("toy.py", None, "slopilot: error: plugin 'toy.py' (--plugin): give a module name such as 'toy'"),
])
def test_a_plugin_that_fails_to_import_is_named(tmp_path, module, env, error):
    (tmp_path / "broken.py").write_text("from routing.scorers import register_scorer\n"
                                        "register_scorer('queue', None, lambda reps, ctx: [])\n")
    (tmp_path / "needs_dep.py").write_text("import some_missing_dependency\n")
    flags = ["--plugin", module] if module else []
    p = slopilot(*flags, "lint", str(ROOT / "examples" / "keda_queue.yaml"), cwd=tmp_path,
                 env={"SLOPILOT_PLUGINS": env} if env else None)
    assert p.returncode == 2 and p.stderr.startswith(error), p.stderr
    assert "Traceback" not in p.stderr


def test_the_planners_worker_processes_import_them(tmp_path, monkeypatch):
    """`slopilot --plugin` leaves the list in SLOPILOT_PLUGINS; a spawned worker imports it first."""
    from simulator.planner.sweep import Job, PoolRunner

    scenario = yaml.safe_load(TOY_SCENARIO.replace("duration: 600", "duration: 120"))
    monkeypatch.setenv("SLOPILOT_PLUGINS", TOY_POLICY)
    runner = PoolRunner(1)
    try:
        handle = runner.submit(Job(scenario, 1, timeline=True))
        result = runner.result(runner.done([handle])[0])
    finally:
        runner.close()
    assert max(row[1] for row in result["timeline"]) > 1  # toyQueue scaled the pool in the worker
