"""The OpenAI API through the official `openai` client, against servers on free loopback ports."""

import asyncio

import openai
import pytest

from engine.args import EngineArgs
from engine.server import BackgroundServer, build_engine, build_server
from simulator.latency import load_latency_model

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def real():
    engine, name = build_engine(EngineArgs("tiny", max_num_seqs=48, max_model_len=MAX_MODEL_LEN))
    with BackgroundServer(build_server(engine, name)) as server:
        yield server


@pytest.fixture(scope="module")
def emulated():
    engine, name = build_engine(EngineArgs(max_num_seqs=48, max_model_len=MAX_MODEL_LEN),
                                load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, "emu")) as server:
        yield server


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def prompt_tokens(text: str) -> int:
    return 1 + len(text.encode())  # byte tokenizer: BOS + one id a byte


def test_models_lists_the_served_model(real):
    models = client(real).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == MAX_MODEL_LEN


@pytest.mark.parametrize("stream", [False, True])
def test_completion_usage_counts(real, stream):
    c = client(real)
    prompt = "The autoscaler saw the queue grow and"
    if not stream:
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=12, extra_body={"ignore_eos": True})
        assert r.object == "text_completion"
        assert r.choices[0].finish_reason == "length"
        usage, text = r.usage, r.choices[0].text
    else:
        chunks = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=12, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}))
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-2].choices[0].finish_reason == "length"
        assert all(ch.usage is None for ch in chunks[:-1])
        assert len(chunks) == 12 + 1  # one chunk a token, even when a token has no text of its own
        usage, text = chunks[-1].usage, "".join(ch.choices[0].text for ch in chunks[:-1])
    assert usage.prompt_tokens == prompt_tokens(prompt)
    assert usage.completion_tokens == 12
    assert usage.total_tokens == usage.prompt_tokens + 12
    assert isinstance(text, str)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion(emulated, stream):
    c = client(emulated)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    if not stream:
        r = c.chat.completions.create(model="emu", messages=messages, max_tokens=11)
        assert r.object == "chat.completion"
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content == "lorem ipsum"  # the filler text
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 11
        return
    chunks = list(c.chat.completions.create(model="emu", messages=messages, max_tokens=11, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == "lorem ipsum"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 11
    # the built-in template: one block a turn, then the assistant cue
    template = "<|system|>\nbe brief\n<|user|>\nhello\n<|assistant|>\n"
    assert chunks[-1].usage.prompt_tokens == prompt_tokens(template)


def test_chat_without_max_tokens_fills_the_context(emulated):
    r = client(emulated).chat.completions.create(model="emu", messages=[{"role": "user", "content": "x"}],
                                                 extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == MAX_MODEL_LEN


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_on_filler(emulated, stream):
    c = client(emulated)
    if not stream:
        r = c.completions.create(model="emu", prompt="go", max_tokens=40, stop=["dolor"])
        assert r.choices[0].text == "lorem ipsum "
        assert r.choices[0].finish_reason == "stop"
        return
    chunks = list(c.completions.create(model="emu", prompt="go", max_tokens=40, stop=["dolor", "zzz"],
                                       stream=True))
    # the stream holds back what could still become a stop string: nothing of "dolor" leaks out
    assert "".join(ch.choices[0].text for ch in chunks) == "lorem ipsum "
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_on_the_real_model(real, stream):
    c = client(real)
    kw = dict(model="tiny", prompt="Capacity planning starts with", temperature=0, max_tokens=24,
              extra_body={"ignore_eos": True})
    full = c.completions.create(**kw).choices[0].text
    assert len(full) >= 3, full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    expected = full[:full.find(stop)]
    if not stream:
        r = c.completions.create(**kw, stop=[stop])
        text, reason = r.choices[0].text, r.choices[0].finish_reason
    else:
        chunks = list(c.completions.create(**kw, stop=[stop], stream=True))
        text, reason = "".join(ch.choices[0].text for ch in chunks), chunks[-1].choices[0].finish_reason
    assert text == expected
    assert reason == "stop"


def test_greedy_matches_offline_generate(real):
    from engine import LLM, SamplingParams

    prompt = "A paged KV cache stores"
    r = client(real).completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10,
                                        extra_body={"ignore_eos": True})
    offline = LLM("tiny", max_model_len=MAX_MODEL_LEN).generate(
        prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    assert r.choices[0].text == offline.text


def test_token_id_prompt(real):
    ids = [256, 72, 105]  # BOS "Hi"
    r = client(real).completions.create(model="tiny", prompt=ids, max_tokens=3,
                                        extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 3


def test_many_concurrent_streams_all_complete(real):
    async def one(c: openai.AsyncOpenAI, i: int):
        stream = await c.completions.create(model="tiny", prompt=f"request number {i}", max_tokens=8,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
        chunks = [ch async for ch in stream]
        return chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens

    async def main():
        async with openai.AsyncOpenAI(base_url=real.url + "/v1", api_key="x", max_retries=0) as c:
            return await asyncio.gather(*(one(c, i) for i in range(40)))

    results = asyncio.run(main())
    assert results == [("length", 8)] * 40
