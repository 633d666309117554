"""Greedy parity with transformers when the engine runs on the Triton kernels (interpreter on CPU)."""

import os

if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest

from engine import LLM, SamplingParams
from engine.attention import triton_attention
from tests.engine.engine_helpers import hf_greedy, mixed_prompts, save_random_llama

MAX_NEW = 6  # the interpreter runs every kernel program in Python: few steps keep this fast


def run_ours(model_dir, prompts, **engine_args):
    llm = LLM(str(model_dir), attention_backend="triton", **engine_args)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    assert llm.engine.block_manager.check_no_leak() == []
    return llm, [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("llama_triton"))


def test_triton_greedy_parity_chunked_mixed_batches(model_dir, monkeypatch):
    prompts = mixed_prompts(4, seed=3, lengths=(1, 9, 40, 75))
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    # several splits even for these short contexts, so the split-K merge is on the path
    monkeypatch.setattr(triton_attention, "choose_num_splits", lambda *args, **kwargs: 3)
    # a 24-token budget: prefill chunks share steps with the other sequences' decodes
    llm, got = run_ours(model_dir, prompts, max_num_seqs=4, max_num_batched_tokens=24)
    assert llm.engine.runner.backend.name == "triton"
    assert got == expected


def test_triton_greedy_parity_with_prefix_cache_hits(model_dir):
    shared = mixed_prompts(1, seed=5, lengths=(48,))[0]
    prompts = [shared + tail for tail in mixed_prompts(3, seed=6, lengths=(1, 5, 17))]
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    llm, got = run_ours(model_dir, prompts, max_num_seqs=1, max_num_batched_tokens=256)
    assert llm.engine.block_manager.prefix_cache_hits > 0
    assert got == expected
