"""Our server refuses and accepts sampling parameters where a real vLLM does: each request goes to
both, and both answer with the same status (400 outside vLLM's ranges, 200 at their edges, 404 for
an unknown model). Values vLLM accepts but our engine does not implement (penalties, n > 1, ...)
are left out: there we answer 400 on purpose."""

import json

import httpx
import pytest

from engine.args import EngineArgs
from engine.server import BackgroundServer, build_engine, build_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NAN, INF = float("nan"), float("inf")
CASES = [  # (fields, status both must answer)
    ({"temperature": -0.1}, 400), ({"temperature": 2.5}, 400), ({"temperature": NAN}, 400),
    ({"temperature": INF}, 400), ({"top_p": 0}, 400), ({"top_p": 1.5}, 400), ({"top_k": -2}, 400),
    ({"seed": 2**63}, 400), ({"seed": -(2**63) - 1}, 400), ({"n": 0}, 400), ({"max_tokens": 0}, 400),
    ({"max_tokens": -1}, 400), ({"presence_penalty": 2.5}, 400), ({"frequency_penalty": -2.5}, 400),
    ({"repetition_penalty": 0}, 400), ({"min_p": 1.5}, 400), ({"min_tokens": -1}, 400),
    ({"logprobs": 21}, 400), ({"stop": [""]}, 400),
    ({"temperature": 0}, 200), ({"temperature": 2}, 200), ({"temperature": 1e-300}, 200),
    ({"top_p": 1e-300}, 200), ({"top_k": -1}, 200), ({"top_k": 0}, 200), ({"seed": -(2**63)}, 200),
    ({"seed": 2**63 - 1}, 200), ({"presence_penalty": 0}, 200), ({"max_tokens": 1}, 200),
    ({"model": "no-such-model"}, 404),
]


@pytest.fixture(scope="module")
def ours():
    engine, name = build_engine(EngineArgs("tiny", max_model_len=512))
    with BackgroundServer(build_server(engine, name)) as s:
        yield s


def status(url: str, model: str, fields: dict) -> int:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 2, **fields}, allow_nan=True)
    r = httpx.post(url + "/v1/completions", content=body.encode(), timeout=120, trust_env=False,
                   headers={"content-type": "application/json"})
    return r.status_code


@pytest.mark.parametrize("fields, expected", CASES, ids=[json.dumps(c[0]) for c in CASES])
def test_same_status_as_vllm(vllm_server, ours, fields, expected):
    theirs = status(vllm_server.url, "tiny", fields)  # vLLM serves its model under "tiny" too
    mine = status(ours.url, "tiny", fields)
    assert (theirs, mine) == (expected, expected)
