"""Bad input, auth, overload, loading and a dead engine: status codes and OpenAI-style error bodies;
a hypothesis fuzz of the request schemas finds no 5xx; disconnected clients free their KV blocks."""

import json
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.args import EngineArgs
from engine.emulated import EmulatedRunner
from engine.llm_engine import LLMEngine
from engine.server import BackgroundServer, build_engine, build_server
from simulator.latency import load_latency_model
from tests.server_helpers import CHAT, CMPL, assert_error, idle, metric, wait_for

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module", params=["real", "emulated"])
def server(request):
    if request.param == "real":
        engine, name = build_engine(EngineArgs("tiny", max_model_len=MAX_MODEL_LEN))
    else:
        engine, name = build_engine(EngineArgs(max_model_len=MAX_MODEL_LEN), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name)) as s:
        s.model = name
        yield s


@pytest.fixture(scope="module")
def slow():
    """Emulated 70B replica: steps of 30-50 ms, long enough to catch requests mid-flight."""
    engine, name = build_engine(EngineArgs(max_num_seqs=1, max_model_len=1024),
                                load_latency_model("h100-llama2-70b-tp4"))
    with BackgroundServer(build_server(engine, name, max_waiting=1)) as s:
        s.model = name
        yield s


BAD = [  # (id, endpoint, body (bytes are sent raw), param expected in the error or None)
    ("malformed-json", CMPL, b'{"prompt": "x",', None),
    ("malformed-json-chat", CHAT, b'{"messages": [', None),
    ("not-an-object", CMPL, b"[1, 2]", None),
    ("max-tokens-string", CMPL, {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("prompt-number", CMPL, {"prompt": 5}, None),
    ("temperature-string", CMPL, {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("messages-string", CHAT, {"messages": "hi"}, "messages"),
    ("message-without-role", CHAT, {"messages": [{"content": "hi"}]}, None),
    ("missing-prompt", CMPL, {"max_tokens": 3}, "prompt"),
    ("max-tokens-0", CMPL, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("max-tokens-negative", CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": -3},
     "max_tokens"),
    ("over-context", CMPL, {"prompt": "x" * 500, "max_tokens": 100}, "max_tokens"),
    ("prompt-fills-context", CHAT, {"messages": [{"role": "user", "content": "x" * 600}]}, "prompt"),
    ("empty-prompt", CMPL, {"prompt": ""}, "prompt"),
    ("empty-token-prompt", CMPL, {"prompt": []}, "prompt"),
    ("empty-messages", CHAT, {"messages": []}, "messages"),
    ("negative-temperature", CMPL, {"prompt": "x", "temperature": -1}, None),
    ("top-p-zero", CMPL, {"prompt": "x", "top_p": 0}, None),
    ("n-2", CMPL, {"prompt": "x", "n": 2}, "n"),
    ("token-outside-vocab", CMPL, {"prompt": [1, 99999]}, "prompt"),
    ("batched-prompts", CMPL, {"prompt": ["a", "b"]}, "prompt"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_gets_400(server, case):
    _, path, body, param = case
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"})
    assert_error(r, 400, param)


@pytest.mark.parametrize("path, body", [
    (CMPL, {"model": "gpt-9", "prompt": "x"}),
    (CHAT, {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
    (CMPL, {"model": "", "prompt": "x"}),
])
def test_unknown_model_is_404_not_found(server, path, body):
    err = assert_error(httpx.post(server.url + path, json=body), 404, "model")
    assert err["type"] == "NotFoundError"


def test_openai_client_sees_bad_request(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=server.model, prompt="x", max_tokens=MAX_MODEL_LEN)
    assert "maximum context length" in e.value.message


def test_api_key():
    engine, name = build_engine(EngineArgs(), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name, api_key="sekrit")) as s:
        body = {"prompt": "hi", "max_tokens": 2}
        assert_error(httpx.post(s.url + CMPL, json=body), 401)
        assert_error(httpx.post(s.url + CMPL, json=body, headers={"Authorization": "Bearer nope"}), 401)
        # the key is checked before the body is parsed: a bad body without a key is still 401
        assert_error(httpx.post(s.url + CMPL, content=b"{", headers={"Authorization": "x"}), 401)
        assert_error(httpx.get(s.url + "/v1/models"), 401)
        ok = httpx.post(s.url + CMPL, json=body, headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0).models.list()
        # probes and scrapes stay open
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/metrics").status_code == 200


def test_health_hold_keeps_health_at_503():
    engine, name = build_engine(EngineArgs(), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name, health_hold=0.6)) as s:
        t0 = time.monotonic()
        assert httpx.get(s.url + "/health").status_code == 503
        assert_error(httpx.post(s.url + CMPL, json={"prompt": "x", "max_tokens": 1}), 503)
        while httpx.get(s.url + "/health").status_code == 503:
            time.sleep(0.05)
        assert time.monotonic() - t0 >= 0.5
        assert httpx.post(s.url + CMPL, json={"prompt": "x", "max_tokens": 1}).status_code == 200
        assert httpx.get(s.url + "/version").json()["version"]


class BrokenRunner(EmulatedRunner):
    def execute(self, seqs, num_new_tokens):
        raise RuntimeError("device lost")


def test_dead_engine_gives_503():
    from engine.llm_engine import MAX_FAILED_ALONE

    runner = BrokenRunner(load_latency_model("cpu-tiny"), num_kv_blocks=64)
    engine = LLMEngine(EngineArgs("broken"), runner=runner)
    with BackgroundServer(build_server(engine, "broken")) as s:
        assert httpx.get(s.url + "/health").status_code == 200
        # a request failing alone may be its own fault: 500 for it, the server stays up
        for _ in range(MAX_FAILED_ALONE - 1):
            err = assert_error(httpx.post(s.url + CMPL, json={"prompt": "x", "max_tokens": 2}), 500)
            assert "device lost" in err["message"]
            assert httpx.get(s.url + "/health").status_code == 200
        # every request failing: the runner is broken, the engine loop ends and /health says so
        err = assert_error(httpx.post(s.url + CMPL, json={"prompt": "x", "max_tokens": 2}), 503)
        assert "device lost" in err["message"]
        assert httpx.get(s.url + "/health").status_code == 503
        err = assert_error(httpx.post(s.url + CMPL, json={"prompt": "x", "max_tokens": 2}), 503)
        assert "engine loop died" in err["message"]


def test_stream_disconnect_aborts_and_frees_kv(slow):
    aborts = metric(slow.url, "vllm:request_success_total", finished_reason="abort")
    with httpx.stream("POST", slow.url + CMPL, json={"prompt": "x" * 200, "max_tokens": 500,
                                                      "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert metric(slow.url, "vllm:kv_cache_usage_perc") > 0
    # the connection is closed mid-stream: the request is aborted, its blocks freed
    assert wait_for(lambda: idle(slow.url)), httpx.get(slow.url + "/metrics").text
    assert metric(slow.url, "vllm:request_success_total", finished_reason="abort") == aborts + 1


def test_non_stream_disconnect_aborts_and_frees_kv(slow):
    aborts = metric(slow.url, "vllm:request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow.url + CMPL, json={"prompt": "y" * 100, "max_tokens": 500}, timeout=0.4)
    assert wait_for(lambda: idle(slow.url))
    assert metric(slow.url, "vllm:request_success_total", finished_reason="abort") == aborts + 1


def test_overload_gets_429_at_once(slow):
    # max_num_seqs=1 and max_waiting=1: one request runs, one waits, the next is refused
    def long_request(results: list):
        try:
            results.append(httpx.post(slow.url + CMPL, json={"prompt": "z", "max_tokens": 30}, timeout=30))
        except httpx.HTTPError as e:  # pragma: no cover - reported by the asserts below
            results.append(e)

    results: list = []
    threads = [threading.Thread(target=long_request, args=(results,)) for _ in range(2)]
    threads[0].start()
    assert wait_for(lambda: metric(slow.url, "vllm:num_requests_running") == 1)
    threads[1].start()
    assert wait_for(lambda: metric(slow.url, "vllm:num_requests_waiting") == 1)
    t0 = time.monotonic()
    r = httpx.post(slow.url + CMPL, json={"prompt": "z", "max_tokens": 30})
    assert time.monotonic() - t0 < 0.5
    assert_error(r, 429)
    for t in threads:
        t.join(30)
    assert [x.status_code for x in results] == [200, 200]
    assert wait_for(lambda: idle(slow.url))


# -- fuzzing the request schemas --------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-2, 3, allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def schema_fields(app, model: str) -> list[str]:
    """The request fields as the app's own OpenAPI schema lists them."""
    return sorted(app.openapi()["components"]["schemas"][model]["properties"])


@pytest.fixture(scope="module")
def fuzz_server():
    engine, name = build_engine(EngineArgs(max_model_len=256), load_latency_model("cpu-tiny"))
    app = build_server(engine, name)
    with BackgroundServer(app) as s:
        s.fields = {CMPL: schema_fields(app, "CompletionRequest"),
                    CHAT: schema_fields(app, "ChatCompletionRequest")}
        yield s


def message_strategy():
    return st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | json_values},
                                 optional={"content": st.text(max_size=20) | json_values})


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_finds_no_5xx(fuzz_server, data):
    path = data.draw(st.sampled_from([CMPL, CHAT]))
    fields = fuzz_server.fields[path]
    plausible = {"prompt": st.text(max_size=30) | st.lists(st.integers(0, 600), max_size=5),
                 "messages": st.lists(message_strategy(), max_size=3),
                 "max_tokens": st.integers(-2, 12), "model": st.just("cpu-tiny") | st.text(max_size=5),
                 "stream": st.booleans(), "stop": st.text(max_size=3) | st.lists(st.text(max_size=3))}
    body = data.draw(st.dictionaries(st.sampled_from(fields), json_values, max_size=5))
    for key, strategy in plausible.items():  # often well-formed, so the generation path is reached too
        if key in fields and data.draw(st.booleans()):
            body[key] = data.draw(strategy)
    if data.draw(st.booleans()):
        body["max_tokens"] = data.draw(st.integers(1, 8))
    raw = data.draw(st.none() | st.binary(max_size=20))
    content = raw if raw is not None else json.dumps(body).encode()
    r = httpx.post(fuzz_server.url + path, content=content, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert_error(r, r.status_code)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_fuzz_leaves_no_blocks_behind(fuzz_server):
    assert wait_for(lambda: idle(fuzz_server.url))
