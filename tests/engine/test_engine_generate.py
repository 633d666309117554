"""LLM.generate behaviour on the tiny preset: errors, stops, seeds, aborts, no leaked blocks."""

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=8, num_kv_blocks=48, block_size=16, max_num_batched_tokens=256)


def test_outputs_in_input_order_with_timings(llm):
    prompts = ["one", "a much longer prompt " * 5, [5, 6, 7]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [5, 5, 5]
    assert outs[0].prompt == "one" and outs[2].prompt_token_ids == [5, 6, 7]
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert o.finish_reason == "length" and o.text == llm.tokenizer.decode(o.token_ids)


def test_request_that_cannot_fit_is_rejected_and_others_finish(llm):
    too_long = [9] * (48 * 16 + 5)
    outs = llm.generate(["fine", too_long, "also fine"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert outs[1].finish_reason == "error" and "KV cache holds 768 tokens" in outs[1].error
    assert outs[0].finish_reason == outs[2].finish_reason == "length"
    assert llm.engine.block_manager.check_no_leak() == []


def test_stop_strings_and_stop_token_ids(llm):
    base = llm.generate("stop test", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert len(base.text) >= 4
    stop = base.text[2:4]
    out = llm.generate("stop test", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                   stop=[stop]))[0]
    assert out.finish_reason == "stop" and stop not in out.text and base.text.startswith(out.text)
    token = base.token_ids[3]
    out = llm.generate("stop test", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                   stop_token_ids=[token]))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == token
    assert token not in out.token_ids[:-1]


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    p = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_tokens=10, ignore_eos=True)
    alone = llm.generate("seeded", p)[0].token_ids
    crowd = llm.generate(["x", "seeded", "y" * 40], [SamplingParams(temperature=1.0, max_tokens=10), p,
                                                    SamplingParams(temperature=0.7, max_tokens=10)])
    assert crowd[1].token_ids == alone
    other = llm.generate("seeded", SamplingParams(temperature=1.0, seed=99, max_tokens=10, ignore_eos=True))
    assert other[0].token_ids != alone


def test_abort_frees_blocks(llm):
    engine = llm.engine
    seqs = [engine.add_request("abort me " * (i + 1), SamplingParams(max_tokens=50, ignore_eos=True),
                               request_id=f"ab-{i}") for i in range(6)]
    engine.step()
    engine.step()
    assert engine.block_manager.usage > 0
    for s in seqs:
        assert engine.abort(s.request_id)
        assert engine.pop_output(s.request_id).finish_reason == "abort"
    assert not engine.has_unfinished()
    assert engine.block_manager.check_no_leak() == [] and engine.block_manager.usage == 0.0


def test_arrival_times_are_replayed(llm):
    outs = llm.generate(["a", "b"], SamplingParams(max_tokens=2, ignore_eos=True), arrival_times=[0.0, 0.2])
    gap = outs[1].metrics.arrival_time - outs[0].metrics.arrival_time
    assert 0.19 <= gap <= 0.3
    assert outs[1].metrics.first_scheduled_time >= outs[1].metrics.arrival_time


def test_bad_arguments_raise_clear_errors(llm):
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["x"], [SamplingParams(), SamplingParams()])
