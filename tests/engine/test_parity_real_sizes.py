"""Greedy parity with transformers at real sizes: the ~80M and ~400M random Llamas of the engine
benchmarks (fused projections, packed oneDNN weights and the paged kernels all on the path).

float32: 20 prompts, our greedy tokens equal transformers' token for token. bfloat16: last-position
logits against transformers' float32 ones, relative to their largest, within test_model_bf16's 3e-2
or 1.5x transformers' own bfloat16 error, whichever is larger (twelve bf16 layers drift more than
two: on the 80M model transformers' bf16 is off by 6.2%, ours by 5.4%, the same as before the fused
and packed layers), and the next token agreeing on at least 5 of 6 prompts. Both take minutes on
two shared cores (80M: 140-340 s, 400M: 460 s, at load 8-10), hence slow.

Measured 2026-12-05 (both pass: 80M 21 s, 400M 255 s, load 1.4 rising to 12). bf16 against
transformers' float32, max relative error of the last-position logits: 80M ours 5.35% (transformers'
bf16 6.19%), 400M ours 9.72% (10.18%); so the 3e-2 of test_model_bf16 (two layers) alone would fail
any bf16 run at these depths, transformers' included. Ours against transformers' own bf16: 3.33%
(80M), 6.13% (400M); next token equal to float32's on 20/20 (80M) and 17/20 (400M) prompts
(transformers' bf16: 19/20, 16/20); the 8 greedy bf16 tokens equal transformers' bf16 ones on 16 of
20 prompts at both sizes (141 and 134 of 160 tokens).
"""

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.engine_helpers import hf_greedy, mixed_prompts, save_random_llama

SHAPES = {
    "80m": dict(vocab_size=2048, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=12, num_key_value_heads=4, initializer_range=0.05),
    "400m": dict(vocab_size=2048, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=8, initializer_range=0.05),
}
MAX_NEW = 8
NUM_PROMPTS = 20
LENGTHS = (1, 7, 16, 33, 64, 100, 129, 5, 250, 40)


def prompts() -> list[list[int]]:
    return mixed_prompts(NUM_PROMPTS, seed=11, vocab=2048, lengths=LENGTHS)


def ours(path, dtype: str, max_new: int) -> list[list[int]]:
    llm = LLM(str(path), dtype=dtype, max_num_seqs=NUM_PROMPTS, num_kv_blocks=NUM_PROMPTS * 20)
    outs = llm.generate(prompts(), SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True))
    return [o.token_ids for o in outs]


def hf_last_logits(path, prompt_list: list[list[int]], dtype=torch.float32) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=dtype).eval()
    with torch.no_grad():
        return torch.stack([model(torch.tensor([p])).logits[0, -1].float() for p in prompt_list])


def our_last_logits(path, dtype: str, prompt_list: list[list[int]]) -> torch.Tensor:
    from engine.core.sequence import Sequence
    from engine.model_runner import ModelRunner

    runner = ModelRunner(str(path), num_kv_blocks=NUM_PROMPTS * 20, dtype=dtype)
    seqs, block = [], 0
    for p in prompt_list:
        s = Sequence(p)
        n = -(-len(p) // runner.block_size)
        s.block_table = list(range(block, block + n))
        block += n
        seqs.append(s)
    return runner.execute_logits(seqs, [len(p) for p in prompt_list])


def check_size(tmp_path, size: str) -> None:
    path = save_random_llama(tmp_path / size, **SHAPES[size])
    expected = hf_greedy(path, prompts(), MAX_NEW)
    assert len({tuple(e) for e in expected}) > 10  # varied continuations: the check can fail
    assert ours(path, "float32", MAX_NEW) == expected
    ref = hf_last_logits(path, prompts())

    def rel_err(x: torch.Tensor) -> float:
        return ((x - ref).abs().max() / ref.abs().max()).item()

    theirs = rel_err(hf_last_logits(path, prompts(), torch.bfloat16))
    got = our_last_logits(path, "bfloat16", prompts())
    err = rel_err(got)
    assert err < max(3e-2, 1.5 * theirs), f"bf16 logits: rel err {err} (transformers' bf16: {theirs})"
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 5 / 6, f"bf16 next tokens agree on {agree:.0%} of prompts"


@pytest.mark.slow
def test_greedy_parity_80m(tmp_path):
    check_size(tmp_path, "80m")


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 600 s was not enough at load 10 (float32 parity had passed by then)
def test_greedy_parity_400m(tmp_path):
    check_size(tmp_path, "400m")
