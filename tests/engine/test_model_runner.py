"""ModelRunner over the tiny preset: batching, chunking, sampling and its input checks."""

import copy

import pytest
import torch

from engine.attention import get_backend
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.model_runner import ModelRunner

BLOCK = 4


@pytest.fixture(scope="module")
def runner():
    return ModelRunner("tiny", num_kv_blocks=128, block_size=BLOCK, seed=0)


class Blocks:
    """Hands out block ids in a scattered order, as a stand-in for the block manager."""

    def __init__(self, n=128):
        self.free = [(i * 37) % n for i in range(n)]

    def cover(self, seq, length):
        while len(seq.block_table) * BLOCK < length:
            seq.block_table.append(self.free.pop(0))


def generate(runner, blocks, seqs, steps):
    """Whole prompts first, then one decode per step; updates seqs like the engine would."""
    counts = [len(s.token_ids) - s.num_computed_tokens for s in seqs]
    for _ in range(steps):
        for s, n in zip(seqs, counts):
            blocks.cover(s, s.num_computed_tokens + n)
        tokens = runner.execute(seqs, counts)
        for s, n, t in zip(seqs, counts, tokens):
            s.num_computed_tokens += n
            s.append_token(t)
        counts = [1] * len(seqs)
    return [s.output_token_ids for s in seqs]


def test_runner_attributes(runner):
    assert runner.config.name == "tiny" and runner.eos_token_id == 257
    assert runner.max_model_len == 512  # the cache (128 blocks of 4) is shorter than 1024 positions
    assert len(runner.kv_caches) == 2 and runner.kv_caches[0][0].shape == (128, BLOCK, 2, 16)
    assert runner.tokenizer.decode(runner.tokenizer.encode("abc")) == "abc"
    from engine.attention.cpu_backend import kernels_available

    assert runner.backend.name == ("cpu" if kernels_available() else "torch")
    assert runner.dtype == torch.float32


def test_preset_weights_follow_the_seed():
    a = ModelRunner("tiny", num_kv_blocks=4, seed=1).model.checkpoint_parameters()
    b = ModelRunner("tiny", num_kv_blocks=4, seed=1).model.checkpoint_parameters()
    c = ModelRunner("tiny", num_kv_blocks=4, seed=2).model.checkpoint_parameters()
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[w], b[w]) and not torch.equal(a[w], c[w])


def test_execute_does_not_mutate_and_samples_only_finished_chunks(runner):
    blocks = Blocks()
    a = Sequence(runner.tokenizer.encode("hello there"), SamplingParams(temperature=0))
    b = Sequence(runner.tokenizer.encode("hi"), SamplingParams(temperature=0))
    blocks.cover(a, len(a)), blocks.cover(b, len(b))
    before = copy.deepcopy((a.__dict__, b.__dict__))
    out = runner.execute([a, b], [5, len(b)])
    assert out[0] is None and isinstance(out[1], int) and 0 <= out[1] < 512
    assert (a.__dict__, b.__dict__) == before
    assert runner.execute_logits([a, b], [5, len(b)]).shape == (1, 512)


def test_chunked_prefill_equals_whole_prefill(runner):
    blocks = Blocks()
    prompt = runner.tokenizer.encode("a somewhat longer prompt to split")
    whole = Sequence(prompt, SamplingParams(temperature=0))
    blocks.cover(whole, len(prompt))
    want = runner.execute_logits([whole], [len(prompt)])
    chunked = Sequence(prompt, SamplingParams(temperature=0))
    blocks.cover(chunked, len(prompt))
    for start, n in ((0, 7), (7, 13)):
        chunked.num_computed_tokens = start
        assert runner.execute([chunked], [n]) == [None]
    chunked.num_computed_tokens = 20
    got = runner.execute_logits([chunked], [len(prompt) - 20])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_seeded_sampling_independent_of_batch(runner):
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=123)
    alone = Sequence(runner.tokenizer.encode("once upon"), params, request_id="alone")
    out_alone = generate(runner, Blocks(), [alone], steps=6)[0]
    mine = Sequence(runner.tokenizer.encode("once upon"), params, request_id="mine")
    others = [Sequence(runner.tokenizer.encode(p), SamplingParams(temperature=0.8, seed=i),
                       request_id=f"o{i}") for i, p in enumerate(["x", "a longer neighbour prompt"])]
    out_batched = generate(runner, Blocks(), [others[0], mine, others[1]], steps=6)[1]
    assert out_batched == out_alone and len(set(out_alone)) > 1
    for rid in ("alone", "mine", "o0", "o1"):
        runner.release(rid)
    assert not runner._generators


def test_greedy_generation_is_deterministic(runner):
    a = generate(runner, Blocks(), [Sequence([256, 10, 20, 30], SamplingParams(temperature=0))], steps=5)
    b = generate(runner, Blocks(), [Sequence([256, 10, 20, 30], SamplingParams(temperature=0))], steps=5)
    assert a == b and len(a[0]) == 5


def test_input_errors(runner):
    s = Sequence([256, 1, 2, 3, 4, 5])
    s.block_table = [0]
    with pytest.raises(ValueError, match="cannot hold"):
        runner.execute([s], [6])
    s.block_table = [0, 1]
    with pytest.raises(ValueError, match="cannot compute"):
        runner.execute([s], [7])
    with pytest.raises(ValueError, match="one token count"):
        runner.execute([s], [1, 2])


def test_bfloat16_and_bad_names():
    r = ModelRunner("tiny", num_kv_blocks=8, block_size=BLOCK, dtype="bfloat16")
    s = Sequence([256, 5, 6])
    s.block_table = [3]
    logits = r.execute_logits([s], [3])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert r.kv_caches[0][0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float32"):
        ModelRunner("tiny", num_kv_blocks=8, dtype="int8")
    with pytest.raises(ValueError, match="tiny"):
        ModelRunner("no-such-model-dir", num_kv_blocks=8)
    with pytest.raises(ValueError, match="torch"):
        get_backend("nope")
