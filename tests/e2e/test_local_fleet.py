"""The local process fleet with real `slopilot serve --emulate` processes: scaling 1 -> 3 -> 1 with a
SIGTERM drain, a killed replica replaced (ready < current meanwhile), ScaleError keeping the last
state, the Prometheus file_sd file, built-in load, and no process left behind (also when the parent
is interrupted or killed)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

import simulator.latency
from controlplane.fleet import LocalFleet, load_fleet_config
from controlplane.loadgen import LoadGenerator, LoadSpec
from controlplane.targets import ScaleError

ROOT = Path(__file__).resolve().parents[2]
MODEL = "h100-llama2-70b-tp4"


def config(**fields):
    doc = {"name": "t", "emulate": MODEL, "replicas": 1, "min_replicas": 0, "max_replicas": 3,
           "drain_timeout": 10, "start_timeout": 30, **fields}
    return load_fleet_config(doc)


def serving(ports: set[int]) -> list[int]:
    """pids of live (not zombie) replica processes started with `--port P`, P in `ports`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"--port" in cmd and state != "Z":
            port = cmd[cmd.index(b"--port") + 1]
            if port.isdigit() and int(port) in ports:
                found.append(int(d.name))
    return found


def file_sd(fleet: LocalFleet) -> dict[str, dict]:
    groups = json.loads(fleet.file_sd_path.read_text())
    assert all(len(g["targets"]) == 1 and set(g["labels"]) == {"fleet", "replica"} for g in groups)
    return {g["targets"][0]: g["labels"] for g in groups}


def eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {check}")
        time.sleep(0.05)


def stream(url: str, max_tokens: int, first_token: threading.Event, out: dict) -> None:
    body = {"prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    tokens = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60, trust_env=False) as resp:
        out["status"] = resp.status_code
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                tokens += 1
                first_token.set()
    out["tokens"], out["done"] = tokens, time.monotonic()


def test_scale_one_three_one_with_drain_and_file_sd(tmp_path):
    fleet = LocalFleet(config(), tmp_path)
    ports: set[int] = set()
    with fleet:
        assert fleet.replicas() == (1, 1) and fleet.starting() == 0
        ports |= {p["port"] for p in fleet.processes().values()}
        assert list(file_sd(fleet)) == [u.removeprefix("http://") for u in fleet.endpoints()]

        fleet.scale(3, "test: up")
        assert fleet.replicas() == (3, 3)
        procs = fleet.processes()
        assert list(procs) == ["r1", "r2", "r3"] and len({p["port"] for p in procs.values()}) == 3
        ports |= {p["port"] for p in procs.values()}
        assert fleet.endpoints() == [procs[r]["url"] for r in ("r1", "r2", "r3")]
        eventually(lambda: len(file_sd(fleet)) == 3, 2)
        assert file_sd(fleet) == {f"127.0.0.1:{procs[r]['port']}": {"fleet": "t", "replica": r}
                                  for r in procs}
        for url in fleet.endpoints():
            assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
            assert "vllm:num_requests_running" in httpx.get(f"{url}/metrics", trust_env=False).text

        # a request in flight on the newest replica survives the scale-down: SIGTERM drains it
        first, out = threading.Event(), {}
        client = threading.Thread(target=stream, args=(procs["r3"]["url"], 120, first, out))
        client.start()
        assert first.wait(10)
        fleet.scale(1, "test: down")
        assert fleet.replicas() == (1, 1)
        assert fleet.endpoints() == [procs["r1"]["url"]]  # newest first: r3 and r2 go
        assert {r: p["state"] for r, p in fleet.processes().items()} == {
            "r1": "ready", "r2": "terminating", "r3": "terminating"}
        eventually(lambda: list(file_sd(fleet)) == [f"127.0.0.1:{procs['r1']['port']}"], 2)
        client.join(30)
        assert out["status"] == 200 and out["tokens"] == 120
        eventually(lambda: list(fleet.processes()) == ["r1"], 15)
        stopped = {e["replica"]: e for e in fleet.events if e["event"] == "stopped"}
        assert stopped["r2"]["code"] == 0 and stopped["r3"]["code"] == 0  # drained, exited cleanly
        assert serving(ports) == [procs["r1"]["pid"]]
    assert fleet.processes() == {} and file_sd(fleet) == {}
    assert serving(ports) == []
    logs = sorted(p.name for p in (tmp_path / "replicas").iterdir())
    assert logs == ["r1.log", "r2.log", "r3.log"]
    assert "serving" in (tmp_path / "replicas" / "r1.log").read_text()
    with pytest.raises(ScaleError, match="not running"):
        fleet.scale(1, "after stop")


def test_killed_replica_is_replaced_and_load_is_served(tmp_path):
    with LocalFleet(config(replicas=2), tmp_path) as fleet:
        spec = LoadSpec.parse({"arrivals": {"rate": 10}, "duration": 2, "prompt_tokens": 64,
                               "output_tokens": 16})
        result = LoadGenerator(spec, fleet.endpoints).run()
        summary = result.summary()
        assert summary["requests"] == summary["ok"] > 5
        assert {r.endpoint for r in result.records} == set(fleet.endpoints())
        assert all(r.tokens == 16 and 0 < r.ttft < r.e2e for r in result.records)

        before = fleet.processes()
        os.kill(before["r1"]["pid"], signal.SIGKILL)
        seen = []
        eventually(lambda: seen.append(fleet.replicas()) or seen[-1].ready < seen[-1].current, 5)
        assert seen[-1] == (2, 1)
        assert fleet.wait_until_ready(20) and fleet.replicas() == (2, 2)
        after = fleet.processes()
        assert list(after) == ["r2", "r3"] and after["r2"]["pid"] == before["r2"]["pid"]
        died = [e for e in fleet.events if e["event"] == "died"]
        assert [(e["replica"], e["code"]) for e in died] == [("r1", -signal.SIGKILL)]
        eventually(lambda: set(file_sd(fleet)) == {f"127.0.0.1:{after[r]['port']}" for r in after}, 2)
        ports = {p["port"] for p in [*before.values(), *after.values()]}
    assert serving(ports) == []


def test_failed_scales_keep_the_last_state(tmp_path):
    model = tmp_path / "model.json"
    shutil.copy(Path(simulator.latency.__file__).parent / "models" / f"{MODEL}.json", model)
    with LocalFleet(config(emulate=str(model), max_replicas=2), tmp_path / "run") as fleet:
        r1 = fleet.processes()["r1"]
        with pytest.raises(ScaleError, match=r"3 replicas is outside \[0, 2\]"):
            fleet.scale(3, "beyond max")
        assert fleet.replicas() == (1, 1)

        model.unlink()  # the next replica cannot load its model: it exits before getting ready
        failed = r"replica r2 exited with code \d+ before becoming ready:.*model\.json"
        with pytest.raises(ScaleError, match=failed):
            fleet.scale(2, "spawn fails")
        assert fleet.replicas() == (1, 1)
        eventually(lambda: fleet.processes() == {"r1": r1}, 5)
        assert fleet.endpoints() == [r1["url"]]
        assert httpx.get(f"{r1['url']}/health", trust_env=False).status_code == 200

        shutil.copy(Path(simulator.latency.__file__).parent / "models" / f"{MODEL}.json", model)
        fleet.scale(2, "model is back")  # after the crash back-off the next spawn works
        assert fleet.replicas() == (2, 2)
        ports = {p["port"] for p in fleet.processes().values()}
    assert serving(ports) == []


PARENT = textwrap.dedent("""
    import json, signal, sys, time
    # a suite started in the background by a non-interactive shell inherits SIGINT ignored; the
    # parent here stands for an interactive user's process, which Ctrl-C interrupts
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from controlplane.fleet import LocalFleet, load_fleet_config
    cfg = load_fleet_config({"name": "p", "emulate": sys.argv[1], "replicas": 2, "max_replicas": 2,
                             "drain_timeout": 5})
    with LocalFleet(cfg, sys.argv[2]) as fleet:
        print(json.dumps([p["port"] for p in fleet.processes().values()]), flush=True)
        time.sleep(120)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_orphans_when_the_parent_is_interrupted_or_killed(tmp_path, sig):
    if sig == signal.SIGKILL and shutil.which("setpriv") is None:
        pytest.skip("no setpriv: replicas cannot be told of their parent's death")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, MODEL, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    ports: set[int] = set()
    try:
        ports = set(json.loads(parent.stdout.readline()))
        assert len(ports) == 2 and len(serving(ports)) == 2
        parent.send_signal(sig)
        parent.wait(20)
        eventually(lambda: serving(ports) == [], 15)
    finally:
        parent.kill()
        parent.wait()
        for pid in serving(ports):  # a failed check must not leave replicas behind
            os.kill(pid, signal.SIGKILL)


FAKE_SERVE = textwrap.dedent("""
    # a stand-in replica: /health answers the status written in the file named first
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    status_file, port = sys.argv[1], int(sys.argv[sys.argv.index("--port") + 1])
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(int(open(status_file).read()))
            self.end_headers()
        def log_message(self, *args):
            pass
    HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def test_unready_replica_and_start_timeout(tmp_path):
    status = tmp_path / "status"
    status.write_text("200")
    command = [sys.executable, "-c", FAKE_SERVE, str(status)]
    fleet = LocalFleet(config(start_timeout=2), tmp_path / "run", command=command, health_interval=0.1)
    with fleet:
        assert fleet.replicas() == (1, 1)
        status.write_text("503")  # a ready replica failing its probes leaves the ready count
        eventually(lambda: fleet.replicas() == (1, 0), 5)
        assert fleet.starting() == 0 and fleet.processes()["r1"]["state"] == "unready"
        assert fleet.endpoints() == [] and len(file_sd(fleet)) == 1  # Prometheus still scrapes it
        status.write_text("200")
        eventually(lambda: fleet.replicas() == (1, 1), 5)

        never = tmp_path / "never"
        never.write_text("503")
        fleet.command = [sys.executable, "-c", FAKE_SERVE, str(never)]  # new replicas never get healthy
        with pytest.raises(ScaleError, match=r"replica r2 not ready after 2 s \(start_timeout\)"):
            fleet.scale(2, "never healthy")
        assert fleet.replicas().current == 1
        eventually(lambda: list(fleet.processes()) == ["r1"], 5)
        ports = {p["port"] for p in fleet.processes().values()}
    assert fleet.processes() == {} and serving(ports) == []


def test_a_running_prometheus_follows_the_fleet(tmp_path, prometheus):
    with LocalFleet(config(), tmp_path / "run") as fleet:
        prom = prometheus(sd_file=fleet.file_sd_path, scrape_interval=1.0)

        def scraped() -> dict[str, str]:
            """replica -> health of Prometheus's active targets"""
            data = httpx.get(f"{prom.url}/api/v1/targets", trust_env=False).json()["data"]
            return {t["labels"]["replica"]: t["health"] for t in data["activeTargets"]
                    if t["labels"].get("fleet") == "t"}

        def series() -> set[str]:
            q = {"query": "vllm:num_requests_running"}
            result = httpx.get(f"{prom.url}/api/v1/query", params=q, trust_env=False).json()["data"]["result"]
            return {s["metric"]["replica"] for s in result}

        # Prometheus applies discovered changes at most every 5 s: one change is checked here (the
        # file's content on scale-down is checked above)
        eventually(lambda: scraped() == {"r1": "up"}, 12)
        fleet.scale(2, "up")
        eventually(lambda: scraped() == {"r1": "up", "r2": "up"} and series() == {"r1", "r2"}, 12)
