"""Issue finding 10: `logit_bias`, `best_of`, `suffix` (and the other fields vLLM accepts that this
engine does not implement) were accepted and ignored (200; logit_bias {"65": 100} at temperature 0
changed nothing). Now each gets a vLLM-shaped 400 naming the field; its neutral value is still
accepted, and the next good request is served."""

import httpx
import openai
import pytest

from engine.args import EngineArgs
from engine.server import BackgroundServer, build_engine, build_server
from engine.server.protocol import CHAT_ONLY, COMPLETION_ONLY, NOT_IMPLEMENTED
from simulator.latency import load_latency_model
from tests.server_helpers import CHAT, CMPL, assert_error

MSGS = [{"role": "user", "content": "hi"}]
REFUSED = [  # (path, field, a value that would change the answer)
    (CMPL, "logit_bias", {"65": 100}), (CMPL, "best_of", 2), (CMPL, "suffix", "tail"),
    (CMPL, "use_beam_search", True), (CMPL, "length_penalty", 0.5),
    (CMPL, "include_stop_str_in_output", True), (CMPL, "allowed_token_ids", [1, 2]),
    (CMPL, "bad_words", ["x"]), (CMPL, "prompt_logprobs", 1), (CMPL, "truncate_prompt_tokens", 4),
    (CMPL, "guided_json", {"type": "object"}), (CMPL, "guided_regex", "a+"),
    (CMPL, "guided_choice", ["a"]), (CMPL, "guided_grammar", "root ::= 'a'"),
    (CMPL, "structured_outputs", {"regex": "a"}), (CMPL, "response_format", {"type": "json_object"}),
    (CMPL, "logits_processors", ["x"]), (CMPL, "return_tokens_as_token_ids", True),
    (CHAT, "logit_bias", {"65": -100}), (CHAT, "best_of", 3),
    (CHAT, "tools", [{"type": "function", "function": {"name": "f"}}]), (CHAT, "tool_choice", "required"),
    (CHAT, "echo", True), (CHAT, "continue_final_message", True),
]
NEUTRAL = {"logit_bias": {}, "best_of": 1, "suffix": None, "response_format": {"type": "text"},
           "use_beam_search": False, "length_penalty": 1.0}


@pytest.fixture(scope="module")
def server():
    engine, name = build_engine(EngineArgs(max_model_len=512), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name)) as s:
        s.model = name
        yield s


def body(path: str, **fields) -> dict:
    base = {"prompt": "hello"} if path == CMPL else {"messages": MSGS}
    return {**base, "max_tokens": 2, "temperature": 0, **fields}


def test_every_field_in_the_tables_is_covered():
    assert {f for _, f, _ in REFUSED} == set(NOT_IMPLEMENTED) | set(COMPLETION_ONLY) | set(CHAT_ONLY)


@pytest.mark.parametrize("path, field, value", REFUSED,
                         ids=[f"{p.split('/')[-1]}-{f}" for p, f, _ in REFUSED])
def test_unimplemented_fields_get_400_then_the_next_request_is_served(server, path, field, value):
    err = assert_error(httpx.post(server.url + path, json=body(path, **{field: value})), 400, field)
    assert err["type"] == "BadRequestError" and err["code"] == 400 and field in err["message"]
    assert httpx.post(server.url + path, json=body(path)).status_code == 200


def test_neutral_values_are_accepted(server):
    assert httpx.post(server.url + CMPL, json=body(CMPL, **NEUTRAL)).status_code == 200
    chat = {**NEUTRAL, "tools": [], "tool_choice": "none", "echo": False}
    chat.pop("suffix")
    assert httpx.post(server.url + CHAT, json=body(CHAT, **chat)).status_code == 200


def test_the_openai_client_sees_bad_request_for_logit_bias(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        c.completions.create(model=server.model, prompt="A", max_tokens=2, temperature=0,
                             logit_bias={"65": 100})
