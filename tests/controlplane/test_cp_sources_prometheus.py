"""The Prometheus source against a stub of Prometheus' query API (plain HTTP and TLS): KEDA's result
semantics per trigger, timeouts, outages, auth (bearer, basic, custom, mTLS, a CA, unsafeSsl),
per-trigger server addresses and metadata, the aggregates' PromQL, TriggerAuthentication parameters."""

import base64
import json
import math
import shutil
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from autoscaler.spec import load_spec
from controlplane.prometheus_server import free_port
from controlplane.sources.prometheus import PrometheusSource, raw_triggers, resolve_trigger_authentication
from tests.e2e.conftest import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def vector(*values, labels=None):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": dict(labels or {}, i=str(i)), "value": [1.0, str(v)]} for i, v in enumerate(values)]}}


class Stub:
    """Answers /api/v1/query from `answers` (query text -> (status, body) or a body), records requests."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self.answers: dict[str, object] = {}
        self.default = vector()
        self.requests: list[dict] = []
        self.delay = 0.0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urlsplit(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                stub.requests.append({"path": url.path, "params": params, "headers": dict(self.headers)})
                time.sleep(stub.delay)
                answer = stub.answers.get(params.get("query"), stub.default)
                status, body = answer if isinstance(answer, tuple) else (200, answer)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout under test)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def keda(triggers: str):
    return load_spec(f"""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: x}}
spec:
  scaleTargetRef: {{name: x}}
  triggers:
{triggers}
""")


def trig(name: str, query: str, **md) -> str:
    extra = "".join(f"\n        {k}: {json.dumps(v)}" for k, v in md.items())
    return f"""    - type: prometheus
      name: {name}
      metadata:
        query: {json.dumps(query)}
        threshold: "5"{extra}"""


def test_keda_result_semantics_per_trigger(stub):
    stub.answers = {
        "q_empty": vector(), "q_one": vector(3.5), "q_two": vector(1, 2), "q_nan": vector("NaN"),
        "q_inf": vector("+Inf"),
        "q_bad": (400, {"status": "error", "errorType": "bad_data", "error": "parse"}),
        "q_scalar": {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "7"]}},
    }
    spec = keda("\n".join(trig(n, "q_" + n) for n in ("empty", "one", "two", "nan", "inf", "bad", "scalar")))
    src = PrometheusSource(stub.url)
    obs = src.observe(spec, 100.0, 3, 2)
    assert obs.metrics["empty"] is None  # the policy applies ignoreNullValues to it
    assert obs.metrics["one"] == 3.5 and obs.metrics["scalar"] == 7.0
    assert math.isnan(obs.metrics["nan"]) and obs.metrics["inf"] == math.inf
    assert obs.errors == {"two", "bad"}
    assert "multiple elements (2)" in src.last_errors["two"]
    assert "400" in src.last_errors["bad"] and "parse" in src.last_errors["bad"]
    assert (obs.current_replicas, obs.ready_replicas, obs.starting_replicas) == (3, 2, 1)
    assert obs.arrival_rate is None  # a keda policy reads its triggers only: no aggregate queried
    names = ("empty", "one", "two", "nan", "inf", "bad", "scalar")
    assert {r["params"]["query"] for r in stub.requests} == {f"q_{n}" for n in names}


def test_outage_is_an_error_and_a_dead_server_is_asked_once_per_round():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = keda("\n".join(trig(f"t{i}", "up") for i in range(3)))
    src = PrometheusSource(url, aggregates="all")
    obs = src.observe(spec, 0.0, 2)
    assert obs.metrics == {} and obs.arrival_rate is None and obs.num_waiting is None
    assert obs.errors == {"t0", "t1", "t2", "arrival_rate", "mean_prompt_tokens", "num_waiting",
                          "num_running", "kv_usage", "ttft_p", "tpot_p", "itl_p"}
    assert "ConnectionError" in src.last_errors["t0"] and url in src.last_errors["t0"]


def test_timeout_from_the_trigger_metadata(stub):
    stub.delay = 1.0
    spec = keda(trig("slow", "q", timeout="200") + "\n" + trig("next", "q"))  # KEDA: milliseconds
    src = PrometheusSource(stub.url)
    began = time.monotonic()
    obs = src.observe(spec, 0.0, 1)
    assert time.monotonic() - began < 0.9  # the second trigger does not wait on the same dead server
    assert obs.errors == {"slow", "next"}
    assert "no answer within 0.2s" in src.last_errors["slow"]
    stub.delay = 0.0
    assert src.observe(spec, 15.0, 1).errors == set()  # the next round asks again


def test_headers_params_auth_and_server_addresses(stub):
    other = Stub()
    try:
        spec = keda("\n".join([
            trig("a", "qa", customHeaders="X-Scope-OrgID=team1, X-B=2", queryParameters="dedup=false"),
            trig("b", "qb", serverAddress=other.url, authModes="basic"),
            trig("c", "qc", authModes="custom"),
        ]))
        src = PrometheusSource(stub.url, auth={"bearerToken": "tok"},
                               trigger_auth={"b": {"username": "u", "password": "p"},
                                             "c": {"customAuthHeader": "X-Key", "customAuthValue": "v"}},
                               pin_time=True)
        assert src.observe(spec, 1234.5, 1).errors == set()
        a, c = stub.requests
        (b,) = other.requests
        assert a["headers"]["Authorization"] == "Bearer tok"
        assert a["headers"]["X-Scope-OrgID"] == "team1" and a["headers"]["X-B"] == "2"
        assert a["params"] == {"query": "qa", "dedup": "false", "time": "1234.500"}
        assert b["headers"]["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
        assert c["headers"]["X-Key"] == "v" and "Authorization" not in c["headers"]
        # a local fleet's Prometheus replaces every trigger's serverAddress
        src = PrometheusSource(stub.url, override=True, trigger_auth={"b": {"username": "u"}})
        obs = src.observe(spec, 0.0, 1)
        assert not other.requests[1:] and [r["params"]["query"] for r in stub.requests[2:]] == ["qa", "qb"]
        assert obs.errors == {"c"}  # this time c has no auth parameters for its authModes
    finally:
        other.close()


def test_missing_auth_parameter_is_a_per_trigger_error(stub):
    spec = keda(trig("a", "qa", authModes="bearer") + "\n" + trig("b", "qb"))
    src = PrometheusSource(stub.url)
    obs = src.observe(spec, 0.0, 1)
    assert obs.errors == {"a"} and "missing parameter(s) bearerToken" in src.last_errors["a"]


def test_aggregate_queries_and_name_fallbacks(stub):
    sel = 'model_name="m"'
    stub.answers = {
        f"sum(rate(vllm:request_success_total{{{sel}}}[30s]))": vector(2.0),
        f"sum(rate(vllm:request_prompt_tokens_sum{{{sel}}}[30s]))": vector(600.0),
        f"sum(rate(vllm:request_generation_tokens_sum{{{sel}}}[30s]))": vector(100.0),
        f"sum(vllm:num_requests_waiting{{{sel}}})": vector(4),
        f"sum(vllm:num_requests_running{{{sel}}})": vector(9),
        f"avg(vllm:kv_cache_usage_perc{{{sel}}})": vector(),  # an older vLLM: only the old name
        f"avg(vllm:gpu_cache_usage_perc{{{sel}}})": vector(0.5),
        f"sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[30s]))": {
            "status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"le": le}, "value": [1, str(c)]} for le, c in
                (("0.1", 1.0), ("0.5", 3.0), ("+Inf", 4.0))]}},
    }
    src = PrometheusSource(stub.url, window=30.0, selector=sel, aggregates="all")
    obs = src.observe(None, 0.0, 2)
    assert obs.errors == set()
    assert (obs.arrival_rate, obs.mean_prompt_tokens, obs.mean_output_tokens) == (2.0, 300.0, 50.0)
    assert (obs.num_waiting, obs.num_running, obs.kv_usage) == (4.0, 9.0, 0.5)
    assert obs.ttft_p == pytest.approx({50.0: 0.1 + 0.4 * 1 / 2, 90.0: 0.5, 99.0: 0.5})
    assert obs.tpot_p == {} and obs.itl_p == {}
    # the SGLang names when asked
    stub.requests.clear()
    PrometheusSource(stub.url, engine="sglang", aggregates=["num_waiting"]).observe(None, 0.0, 1)
    assert [r["params"]["query"] for r in stub.requests] == ["sum(sglang:num_queue_reqs)"]


# ---- TLS ---------------------------------------------------------------------------------------------
def tls_stub(pki, client_certs: bool) -> Stub:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    if client_certs:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki / "ca.pem")
    s = Stub(tls=ctx)
    s.default = vector(1.0)
    return s


def test_tls_ca_unsafe_ssl_and_client_certificates(pki):
    s = tls_stub(pki, client_certs=False)
    try:
        spec = keda(trig("t", "up"))
        src = PrometheusSource(s.url)
        assert src.observe(spec, 0.0, 1).errors == {"t"}  # unknown CA: refused, said clearly
        assert "CERTIFICATE_VERIFY_FAILED" in src.last_errors["t"]
        ca_text = (pki / "ca.pem").read_text()  # KEDA takes certificates as PEM text from a Secret
        src = PrometheusSource(s.url, auth={"ca": ca_text})
        assert src.observe(spec, 0.0, 1).metrics == {"t": 1.0}
        src.close()
        assert PrometheusSource(s.url).observe(keda(trig("t", "up", unsafeSsl="true")), 0.0, 1).metrics == {
            "t": 1.0}
        unsafe = PrometheusSource(s.url, unsafe_ssl=True)
        assert unsafe.observe(spec, 0.0, 1).metrics == {"t": 1.0}
    finally:
        s.close()
    s = tls_stub(pki, client_certs=True)
    try:
        spec = keda(trig("t", "up", authModes="tls"))
        paths = {"ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"), "key": str(pki / "client.key")}
        assert PrometheusSource(s.url, auth=paths).observe(spec, 0.0, 1).metrics == {"t": 1.0}
        src = PrometheusSource(s.url, auth={"ca": paths["ca"]})  # no client certificate: refused
        assert src.observe(keda(trig("t", "up")), 0.0, 1).errors == {"t"}
    finally:
        s.close()


# ---- TriggerAuthentication and raw triggers ---------------------------------------------------------------
def test_resolve_trigger_authentication():
    doc = {"kind": "TriggerAuthentication", "metadata": {"name": "prom-auth"}, "spec": {
        "secretTargetRef": [{"parameter": "username", "name": "prom", "key": "user"},
                            {"parameter": "password", "name": "prom", "key": "pass"}],
        "env": [{"parameter": "bearerToken", "name": "PROM_TOKEN"}]}}
    secrets = {"prom": {"user": "u", "pass": "p"}}
    params = resolve_trigger_authentication(doc, secrets, env={"PROM_TOKEN": "t"})
    assert params == {"username": "u", "password": "p", "bearerToken": "t"}
    with pytest.raises(ValueError, match=r"prom-auth: spec.secretTargetRef\[1\]: no 'pass'"):
        resolve_trigger_authentication(doc, {"prom": {"user": "u"}}, env={"PROM_TOKEN": "t"})
    with pytest.raises(ValueError, match=r"prom-auth: spec.env\[0\]: variable 'PROM_TOKEN' not set"):
        resolve_trigger_authentication(doc, {"prom": {"user": "u", "pass": "p"}}, env={})


def test_raw_triggers_of_both_kinds():
    ref = "      authenticationRef: {name: a}\n      metadata:"
    so = keda(trig("q", "x", unsafeSsl="true").replace("      metadata:", ref))
    assert raw_triggers(so)["q"]["authenticationRef"] == {"name": "a"}
    ia = load_spec("""
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: x}
spec:
  scaleTargetRef: {name: x}
  maxReplicas: 4
  policy:
    type: keda
    keda:
      triggers:
      - {type: prometheus, metadata: {query: x, threshold: "1", timeout: "100"}}
""")
    assert raw_triggers(ia)["s0"]["metadata"]["timeout"] == "100"
