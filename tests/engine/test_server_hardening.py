"""No request can disable a replica: sampling parameters are checked at the API with vLLM's ranges,
text must be UTF-8, sampling is numerically safe for whatever passes, a request that still fails
inside a step fails alone, and an engine loop that dies makes /health say so and serve() exit.
Includes a hypothesis fuzz of the sampling parameters against the real (tiny, random-weight) model."""

import json
import threading

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.args import EngineArgs
from engine.core.sampling_params import SamplingParams
from engine.emulated import EmulatedRunner
from engine.llm_engine import MAX_FAILED_ALONE, LLMEngine
from engine.sampler import SamplingError, sample
from engine.server import BackgroundServer, build_engine, build_server, serve
from engine.server.defaults import EXIT_ENGINE_DIED
from simulator.latency import load_latency_model
from tests.server_helpers import CHAT, CMPL, assert_error, free_port, idle, metric, wait_for

MAX_MODEL_LEN = 256
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def real():
    """The real model: the tiny preset with random weights."""
    engine, name = build_engine(EngineArgs("tiny", max_model_len=MAX_MODEL_LEN))
    with BackgroundServer(build_server(engine, name)) as s:
        yield s


def post(url: str, path: str, fields: dict, timeout: float = 60) -> httpx.Response:
    """fields on top of a small valid request; NaN and infinities go out as JSON's NaN/Infinity."""
    base = ({"prompt": "hello"} if path == CMPL else {"messages": [{"role": "user", "content": "hello"}]})
    body = json.dumps({**base, "max_tokens": 3, **fields}, allow_nan=True)
    return httpx.post(url + path, content=body.encode(), headers={"content-type": "application/json"},
                      timeout=timeout)


def still_serves(url: str) -> None:
    assert httpx.get(url + "/health").status_code == 200
    r = post(url, CMPL, {"temperature": 0, "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


# -- sampling parameters at the API -----------------------------------------------------------------
OUT_OF_RANGE = [  # (field, value): outside vLLM's ranges, or valid but not implemented here
    ("temperature", -0.1), ("temperature", 2.01), ("temperature", NAN), ("temperature", INF),
    ("temperature", -INF), ("temperature", "hot"),
    ("top_p", 0), ("top_p", -0.5), ("top_p", 1.0001), ("top_p", NAN), ("top_p", INF), ("top_p", -INF),
    ("top_k", -2), ("top_k", 2**63), ("top_k", 1.5),
    ("seed", 2**63), ("seed", -(2**63) - 1), ("seed", 2**64), ("seed", 10**30), ("seed", 0.5),
    ("n", 0), ("n", -1), ("n", 2),
    ("max_tokens", 0), ("max_tokens", -1),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01), ("presence_penalty", NAN),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 3), ("frequency_penalty", INF), ("frequency_penalty", -1),
    ("repetition_penalty", 0), ("repetition_penalty", -1), ("repetition_penalty", INF),
    ("repetition_penalty", 1.1),
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", 0.1),
    ("min_tokens", -1), ("min_tokens", 2),
    ("stop", ""), ("stop", ["a", ""]), ("stop_token_ids", [-1]), ("stop_token_ids", [2**64]),
    ("priority", 2**63),
]


@pytest.mark.parametrize("path", [CMPL, CHAT])
@pytest.mark.parametrize("field, value", OUT_OF_RANGE, ids=[f"{f}={v!r}" for f, v in OUT_OF_RANGE])
def test_out_of_range_sampling_parameter_is_400(real, path, field, value):
    assert_error(post(real.url, path, {field: value}), 400, field)


@pytest.mark.parametrize("path, field, value", [
    (CMPL, "logprobs", -1), (CMPL, "logprobs", 21), (CMPL, "logprobs", 1), (CMPL, "echo", True),
    (CHAT, "top_logprobs", -1), (CHAT, "top_logprobs", 21), (CHAT, "logprobs", True),
    (CHAT, "max_completion_tokens", 0),
])
def test_logprobs_and_endpoint_fields_are_400(real, path, field, value):
    assert_error(post(real.url, path, {field: value}), 400, field)


EDGES_OK = [
    ("temperature", 0), ("temperature", 2), ("temperature", 1e-8), ("temperature", 1e-300),
    ("temperature", 5e-324), ("top_p", 1e-300), ("top_p", 1), ("top_k", -1), ("top_k", 0), ("top_k", 1),
    ("top_k", 2**63 - 1), ("seed", -(2**63)), ("seed", 2**63 - 1), ("seed", 0), ("seed", -1),
    ("presence_penalty", 0), ("frequency_penalty", 0.0), ("repetition_penalty", 1), ("min_p", 0),
    ("min_tokens", 0), ("priority", -(2**63)), ("stop_token_ids", [2**63 - 1]),
]


@pytest.mark.parametrize("path", [CMPL, CHAT])
@pytest.mark.parametrize("field, value", EDGES_OK, ids=[f"{f}={v!r}" for f, v in EDGES_OK])
def test_edge_of_range_is_served(real, path, field, value):
    r = post(real.url, path, {field: value, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_tiny_temperature_samples_like_greedy(real):
    greedy = post(real.url, CMPL, {"temperature": 0, "max_tokens": 8, "ignore_eos": True}).json()
    for t in (1e-30, 1e-300, 5e-324):
        r = post(real.url, CMPL, {"temperature": t, "seed": 3, "max_tokens": 8, "ignore_eos": True}).json()
        assert r["choices"][0]["text"] == greedy["choices"][0]["text"]
    still_serves(real.url)


# -- text that is not UTF-8 -------------------------------------------------------------------------
SURROGATES = [  # (path, raw JSON body with a lone surrogate escape, param)
    (CMPL, r'{"prompt": "a\ud800b"}', "prompt"),
    (CMPL, r'{"prompt": "\udfff"}', "prompt"),
    (CMPL, r'{"prompt": ["ok", "\ud83d"]}', "prompt"),
    (CMPL, r'{"prompt": "x", "model": "tiny\ud800"}', "model"),
    (CMPL, r'{"prompt": "x", "stop": "\udc00"}', "stop"),
    (CMPL, r'{"prompt": "x", "stop": ["a", "\ud800"]}', "stop"),
    (CHAT, r'{"messages": [{"role": "user", "content": "\ud800"}]}', "messages"),
    (CHAT, r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udbff"}]}]}', "messages"),
    (CHAT, r'{"messages": [{"role": "us\ud800er", "content": "x"}]}', "messages"),
    (CHAT, r'{"messages": [{"role": "user", "name": "\ud800", "content": "x"}]}', "messages"),
    (CHAT, r'{"messages": [{"role": "user", "content": "x"}], "model": "\udfff"}', "model"),
]


@pytest.mark.parametrize("path, body, param", SURROGATES)
def test_lone_surrogate_is_400(real, path, body, param):
    r = httpx.post(real.url + path, content=body.encode(), headers={"content-type": "application/json"})
    err = assert_error(r, 400, param)
    assert "surrogate" in err["message"]


def test_surrogate_pairs_are_text(real):
    """An escaped surrogate *pair* is one valid character (here an emoji): served, not refused."""
    body = r'{"prompt": "smile \ud83d\ude00", "max_tokens": 2}'
    r = httpx.post(real.url + CMPL, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 1 + len("smile 😀".encode())


# -- the sampler's numerics -------------------------------------------------------------------------
def rand(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-300, 5e-324, 1e-45])
def test_tiny_temperature_is_greedy_even_for_huge_logits(temperature):
    logits = torch.tensor([[3e38, -3e38, 1.0, 2e38], [0.5, 0.25, 0.75, -1.0]])
    params = [SamplingParams(temperature=temperature)] * 2
    for seed in range(5):
        assert sample(logits, params, [rand(seed), rand(seed)]) == [0, 2]


@pytest.mark.parametrize("temperature", [0, 0.7, 1e-300])
def test_nan_logits_never_win(temperature):
    logits = torch.tensor([[NAN, 1.0, NAN, 0.5], [NAN, NAN, -5.0, NAN]])
    g = rand(1)
    for _ in range(50):
        tokens = sample(logits, [SamplingParams(temperature=temperature)] * 2, [g, g])
        assert tokens[0] in (1, 3) and tokens[1] == 2


@pytest.mark.parametrize("temperature", [0, 1.0, 2.0, 1e-300])
def test_inf_logits_win_among_themselves(temperature):
    logits = torch.tensor([[1.0, INF, 0.0, INF, NAN]])
    g = rand(2)
    drawn = {sample(logits, [SamplingParams(temperature=temperature)], [g])[0] for _ in range(60)}
    assert drawn <= {1, 3} and (temperature == 0 or drawn == {1, 3})


@pytest.mark.parametrize("row", [[NAN, NAN, NAN], [-INF, -INF, -INF], [NAN, -INF, NAN]])
def test_a_row_with_nothing_to_pick_names_its_row(row):
    logits = torch.tensor([[0.0, 1.0, 2.0], row])
    with pytest.raises(SamplingError) as e:
        sample(logits, [SamplingParams(temperature=0), SamplingParams()], [None, rand()])
    assert e.value.row == 1


@pytest.mark.parametrize("fields, message", [
    ({"temperature": NAN}, "temperature"), ({"temperature": INF}, "temperature"),
    ({"temperature": -INF}, "temperature"), ({"temperature": -1e-9}, "temperature"),
    ({"top_p": NAN}, "top_p"), ({"top_p": INF}, "top_p"), ({"top_p": -INF}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"), ({"seed": 10**30}, "seed"),
    ({"top_k": -2}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
])
def test_sampling_params_refuse_what_the_api_refuses(fields, message):
    # the offline API (LLM, LLMEngine.add_request) checks here, where the server checks in its schema
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


@pytest.mark.parametrize("seed", [0, -(2**63), 2**63 - 1, 2**64 - 1])
def test_sampling_params_take_any_64_bit_seed(seed):
    assert SamplingParams(seed=seed).seed == seed


def test_non_finite_temperature_is_a_sampling_error():
    # SamplingParams refuses these; the sampler still never hands torch.multinomial a NaN, whatever
    # reaches it (a caller may change the fields after the checks)
    for t in (NAN, INF):
        params = SamplingParams()
        params.temperature = t
        with pytest.raises(SamplingError):
            sample(torch.zeros(1, 4), [params], [rand()])


@pytest.mark.parametrize("top_p", [1e-300, 1e-8, 0.5])
def test_tiny_top_p_keeps_the_top_token(top_p):
    logits = torch.tensor([[0.1, 5.0, 0.2, 4.0]])
    g = rand(3)
    drawn = {sample(logits, [SamplingParams(top_p=top_p)], [g])[0] for _ in range(30)}
    assert drawn <= {1, 3} and (top_p >= 0.5 or drawn == {1})


# -- a request failing inside a step fails alone ----------------------------------------------------
POISON = 666  # the seed that makes PoisonRunner fail


class PoisonRunner(EmulatedRunner):
    """Fails every batch that holds a request seeded POISON, as a bad row would."""

    def execute(self, seqs, num_new_tokens):
        if any(s.sampling_params.seed == POISON for s in seqs):
            raise RuntimeError("poisoned row")
        return super().execute(seqs, num_new_tokens)


def poison_engine(max_num_seqs: int = 8) -> LLMEngine:
    runner = PoisonRunner(load_latency_model("h100-llama2-70b-tp4"), num_kv_blocks=256)
    return LLMEngine(EngineArgs("poison", max_num_seqs=max_num_seqs), runner=runner)


def test_engine_fails_the_poisoned_request_only():
    engine = poison_engine()
    for i, seed in enumerate([1, POISON, 2, 3]):
        params = SamplingParams(max_tokens=4, seed=seed, ignore_eos=True)
        engine.add_request(f"prompt number {i}", params, str(i))
    while engine.has_unfinished():
        engine.step()
    outs = {i: engine.pop_output(str(i)) for i in range(4)}
    assert outs[1].finish_reason == "error" and "poisoned row" in outs[1].error
    assert all(outs[i].finish_reason == "length" and len(outs[i].token_ids) == 4 for i in (0, 2, 3))
    assert engine.block_manager.usage == 0 and engine.failed_alone == 0


def test_real_model_nan_logits_fail_that_request_only():
    """The real runner and sampler: one request's logits turn NaN mid-batch."""
    engine, _ = build_engine(EngineArgs("tiny", max_model_len=MAX_MODEL_LEN))
    forward = engine.runner._forward_logits

    def poisoned(seqs, num_new_tokens):
        logits, rows = forward(seqs, num_new_tokens)
        samplers = [s for s, n in zip(seqs, num_new_tokens) if s.num_computed_tokens + n == len(s.token_ids)]
        for i, s in enumerate(samplers):
            if s.sampling_params.seed == POISON:
                logits[i] = NAN
        return logits, rows

    engine.runner._forward_logits = poisoned
    for i, seed in enumerate([5, POISON, 6]):
        params = SamplingParams(max_tokens=5, seed=seed, ignore_eos=True)
        engine.add_request([256, 10 + i, 20, 30], params, str(i))
    while engine.has_unfinished():
        engine.step()
    outs = [engine.pop_output(str(i)) for i in range(3)]
    assert outs[1].finish_reason == "error" and "NaN" in outs[1].error
    assert [len(o.token_ids) for o in (outs[0], outs[2])] == [5, 5]


@pytest.mark.parametrize("stream", [False, True])
def test_server_fails_the_poisoned_request_only(stream):
    engine = poison_engine()
    with BackgroundServer(build_server(engine, "poison")) as s:
        errors_before = metric(s.url, "vllm:request_success_total", finished_reason="error")
        results: dict[int, httpx.Response] = {}

        def one(i: int, seed: int):
            body = {"prompt": f"p{i}", "max_tokens": 20, "seed": seed, "ignore_eos": True, "stream": stream}
            results[i] = httpx.post(s.url + CMPL, json=body, timeout=30)

        threads = [threading.Thread(target=one, args=(i, seed)) for i, seed in enumerate([1, 2, 3])]
        for t in threads:
            t.start()
        assert wait_for(lambda: metric(s.url, "vllm:num_requests_running") == 3)
        one(3, POISON)  # joins the running batch
        for t in threads:
            t.join(30)
        if stream:
            events = [line[6:] for line in results[3].text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            err = json.loads(events[-2])["error"]
            assert err["code"] == 500 and "poisoned row" in err["message"]
        else:
            err = assert_error(results[3], 500)
            assert err["type"] == "InternalServerError" and "poisoned row" in err["message"]
        for i in range(3):
            assert results[i].status_code == 200
            if not stream:
                assert results[i].json()["usage"]["completion_tokens"] == 20
            else:
                assert results[i].text.rstrip().endswith("data: [DONE]") and '"error"' not in results[i].text
        assert metric(s.url, "vllm:request_success_total", finished_reason="error") == errors_before + 1
        assert wait_for(lambda: idle(s.url))
        assert httpx.get(s.url + "/health").status_code == 200


class BrokenRunner(EmulatedRunner):
    def execute(self, seqs, num_new_tokens):
        raise RuntimeError("device lost")


def test_dead_engine_loop_exits_the_process_non_zero():
    """serve() (what `slopilot serve` runs) returns EXIT_ENGINE_DIED soon after the loop dies."""
    engine = LLMEngine(EngineArgs("broken"), runner=BrokenRunner(load_latency_model("cpu-tiny"),
                                                                 num_kv_blocks=64))
    port = free_port()
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(serve(build_server(engine, "broken"), port=port)))
    thread.start()
    url = f"http://127.0.0.1:{port}"
    assert wait_for(lambda: _health(url) == 200, 30)
    statuses = []
    for _ in range(MAX_FAILED_ALONE):
        try:
            r = httpx.post(url + CMPL, json={"prompt": "x", "max_tokens": 2}, timeout=10)
            statuses.append(r.status_code)
        except httpx.TransportError as exc:  # pragma: no cover - reported below
            statuses.append(repr(exc))
    thread.join(15)
    assert not thread.is_alive() and code == [EXIT_ENGINE_DIED]
    assert statuses == [500] * (MAX_FAILED_ALONE - 1) + [503]


def _health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health").status_code
    except httpx.TransportError:
        return None


# -- fuzzing the sampling parameters against the real model -----------------------------------------
def floats_near_edges():
    edges = [0.0, -0.0, 1e-300, 5e-324, 1e-45, 1e-8, 0.01, 1.0, 2.0, 2.0000001, -1e-300, 1e300, 1e308,
             NAN, INF, -INF]
    return st.sampled_from(edges) | st.floats(allow_nan=True, allow_infinity=True) | st.floats(-3, 3)


def ints_near_edges():
    edges = [0, 1, -1, -2, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**64 - 1, 10**30]
    return st.sampled_from(edges) | st.integers() | st.integers(-5, 600)


SAMPLING_FIELDS = {
    "temperature": floats_near_edges(), "top_p": floats_near_edges(), "top_k": ints_near_edges(),
    "seed": ints_near_edges(), "max_tokens": st.integers(-2, 6) | ints_near_edges(),
    "n": st.integers(-1, 3), "presence_penalty": floats_near_edges(),
    "frequency_penalty": floats_near_edges(), "repetition_penalty": floats_near_edges(),
    "min_p": floats_near_edges(), "min_tokens": st.integers(-1, 3), "ignore_eos": st.booleans(),
    "stream": st.booleans(), "stop": st.sampled_from(["", "a", ["b", "c"], None]),
    "stop_token_ids": st.lists(ints_near_edges(), max_size=3), "priority": ints_near_edges(),
}


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_sampling_parameters_never_disable_the_engine(real, data):
    path = data.draw(st.sampled_from([CMPL, CHAT]))
    fields = data.draw(st.fixed_dictionaries({}, optional=SAMPLING_FIELDS))
    r = post(real.url, path, fields)
    assert r.status_code in (200, 400), (fields, r.text)
    if r.status_code == 400:
        assert_error(r, 400)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, (fields, r.text)
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    still_serves(real.url)  # after every example, not just at the end


def test_fuzz_leaves_the_engine_idle(real):
    assert wait_for(lambda: idle(real.url))
    still_serves(real.url)
