"""Outages are errors, never zeros: a real Prometheus stopped and restarted under the Prometheus
source, engines killed under the scrape source; and a real Prometheus behind TLS and basic auth."""

import signal
import time
import warnings

import pytest

from autoscaler.spec import load_spec
from controlplane.sources import PrometheusSource, ScrapeSource
from tests.e2e.conftest import SteadyLoad, wait_for

SPEC = load_spec("""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: faults}
spec:
  scaleTargetRef: {name: engines}
  triggers:
  - {type: prometheus, name: running, metadata: {query: "sum(vllm:num_requests_running)", threshold: "8"}}
  - type: prometheus
    name: rate
    metadata: {query: "sum(rate(vllm:request_success_total[10s]))", threshold: "5"}
""")
ALL = {"running", "rate", "arrival_rate", "mean_prompt_tokens", "num_waiting", "num_running", "kv_usage",
       "ttft_p", "tpot_p", "itl_p"}


def test_prometheus_stopped_then_restarted(emulated_servers, prometheus):
    urls = emulated_servers(2)
    prom = prometheus(urls, scrape_interval=1.0)
    source = PrometheusSource(prom.url, window=10.0, aggregates="all", timeout=2.0)
    with SteadyLoad(urls, rate=8, max_tokens=40):
        obs = wait_for(lambda: (o := source.observe(SPEC, time.time(), 2, 2)).metrics.get("rate") and o, 20,
                       what="a request rate from Prometheus")
        assert obs.errors == set() and obs.metrics["rate"] > 0 and obs.arrival_rate > 0

        prom.stop()
        began = time.monotonic()
        obs = source.observe(SPEC, time.time(), 2, 2)
        took = time.monotonic() - began
        assert obs.errors == ALL  # every trigger and every aggregate failed ...
        assert obs.metrics == {} and obs.arrival_rate is None and obs.num_running is None  # ... none is 0
        assert "Connection refused" in source.last_errors["running"]
        assert took < 1.0  # a dead server is asked once per round, not once per query

        prom.start()  # same port, same data
        obs = wait_for(lambda: (o := source.observe(SPEC, time.time(), 2, 2)).errors == set() and o, 20,
                       what="answers again after the restart")
        assert obs.metrics["rate"] > 0 and obs.num_running is not None
    print(f"\nPrometheus down: {len(ALL)} errors in {took * 1000:.0f} ms; back after restart: "
          f"rate {obs.metrics['rate']:.2f}/s, running {obs.metrics['running']:g}")


def test_engines_killed_under_the_scrape_source(emulated_servers):
    urls = emulated_servers(2)
    source = ScrapeSource(urls, window=10.0, aggregates="all", timeout=2.0)
    with SteadyLoad(urls, rate=8, max_tokens=30) as load:
        for _ in range(4):
            time.sleep(1)
            source.scrape()
        both = source.observe(SPEC, time.time(), 2, 2)
        assert both.errors == set() and both.metrics["running"] > 0
        first = emulated_servers.servers[0]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        load.urls = urls[1:]
        time.sleep(1)
        one = source.observe(SPEC, time.time(), 2, 1)
        assert one.errors == set()  # one engine left: its numbers, no error (as Prometheus would do)
        up = [t for t in source.targets.values() if t.up]
        assert [t.url for t in up] == [urls[1] + "/metrics"]
        assert "ConnectError" in source.targets[urls[0] + "/metrics"].error
        assert one.metrics["rate"] > 0  # the dead engine's samples still count within the window
        emulated_servers.servers[1].proc.send_signal(signal.SIGKILL)
        emulated_servers.servers[1].proc.wait()
        load.urls = []
    none = source.observe(SPEC, time.time(), 2, 0)
    assert none.errors == ALL and none.metrics == {} and none.num_waiting is None
    assert "scrape failed on all 2 endpoint(s)" in source.last_errors["running"]
    source.close()


def test_prometheus_behind_tls_and_basic_auth(prometheus, pki):
    try:  # Prometheus' web config takes bcrypt hashes; the system's crypt(3) makes them
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
        hashed = crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    except (ImportError, AttributeError, ValueError, OSError):
        hashed = None
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("no bcrypt in this system's crypt(3)")
    web = {"tls_server_config": {"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
           "basic_auth_users": {"alice": hashed}}
    prom = prometheus([], web_config=web)
    assert prom.url.startswith("https://")
    spec = load_spec("""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: auth}
spec:
  scaleTargetRef: {name: engines}
  triggers:
  - {type: prometheus, name: one, metadata: {query: "vector(1)", threshold: "1", authModes: basic}}
""")
    ca = (pki / "ca.pem").read_text()
    good = PrometheusSource(prom.url, auth={"username": "alice", "password": "s3cret", "ca": ca})
    assert good.observe(spec, time.time(), 1).metrics == {"one": 1.0}
    wrong = PrometheusSource(prom.url, auth={"username": "alice", "password": "nope", "ca": ca})
    assert wrong.observe(spec, time.time(), 1).errors == {"one"}
    assert "401" in wrong.last_errors["one"]
    no_ca = PrometheusSource(prom.url, auth={"username": "alice", "password": "s3cret"})
    assert no_ca.observe(spec, time.time(), 1).errors == {"one"}
    assert "CERTIFICATE_VERIFY_FAILED" in no_ca.last_errors["one"]
    for s in (good, wrong, no_ca):
        s.close()
