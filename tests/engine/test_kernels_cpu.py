"""The C++ CPU paged kernels (attention_backend="cpu") against the torch reference, and greedy parity.

Inputs are fresh random draws every run (the seed is in each failure message). Block tables are
shuffled, non-adjacent blocks of a larger pool; the cache starts as NaN with only the sequences' own
tokens written, and outputs start as NaN: a kernel that reads a slot it should not, or leaves an
output element unwritten, fails the comparison.
"""

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import build_metadata, get_backend, paged_attention_ref, write_kv_ref
from engine.attention.cpu_backend import CpuBackend, kernels_available, paged_attention_cpu
from tests.engine.engine_helpers import hf_greedy, mixed_prompts, save_random_llama

pytestmark = pytest.mark.skipif(not kernels_available(), reason="C++ paged kernels not built")

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def make_batch(seed, seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    pool = list(range(2 * sum(needed) + 3))
    rng.shuffle(pool)
    tables, used = [], 0
    for n in needed:
        tables.append(pool[used:used + n])
        used += n
    k_cache = torch.full((len(pool), block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    total = sum(seq_lens)
    key = torch.randn(total, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(total, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = build_metadata(tables, seq_lens, seq_lens, block_size).slot_mapping
    write_kv_ref(key, value, k_cache, v_cache, slots)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    return query, k_cache, v_cache, build_metadata(tables, seq_lens, query_lens, block_size)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest reference value (NaN anywhere -> inf)."""
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().max() / ref.abs().max()).item()


def run_kernel(query, k_cache, v_cache, meta, scale):
    out = torch.full_like(query, float("nan"))
    got = CpuBackend().forward(query, k_cache, v_cache, meta, scale, out=out)
    assert got is out
    return out


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


CASES = [
    # (num_heads, num_kv_heads, head_dim, block_size, seq_lens, query_lens)
    (4, 4, 64, 16, [1, 37, 64, 100], [1, 1, 1, 1]),  # decodes, GQA 1, partial and exact blocks
    (8, 2, 64, 16, [5, 130, 77], [1, 1, 1]),  # decodes, GQA 4
    (16, 2, 128, 8, [19, 200], [1, 1]),  # decodes, GQA 8, head 128, small blocks
    (8, 1, 128, 32, [33, 1, 90], [1, 1, 1]),  # GQA 8 on one kv head
    (4, 4, 64, 16, [40, 17], [40, 17]),  # plain prefills, partial last blocks
    (8, 2, 64, 16, [70, 31, 45], [20, 1, 45]),  # chunk over a cached prefix + decode + prefill
    (8, 1, 128, 8, [66, 13, 50], [1, 13, 9]),  # GQA 8, head 128: decode, prefill, chunk
    (4, 1, 128, 16, [90, 3], [35, 1]),  # GQA 4: chunk longer than one query tile, a decode
    (32, 1, 64, 16, [300, 2], [70, 2]),  # GQA 32: one token per tile
    (6, 2, 20, 16, [30, 9], [1, 9]),  # head 20: rows padded to the vector width, not read in place
    (8, 2, 32, 5, [3, 41, 17], [1, 1, 17]),  # head 32, 5-token blocks: 8-position chunks span blocks
    (12, 3, 40, 16, [50, 9], [1, 9]),  # head 40: a 32-dim pass and an 8-dim one
    (6, 6, 24, 16, [30, 12], [1, 12]),  # head 24 (three vectors), GQA 1
    (3, 1, 96, 16, [70, 21], [1, 21]),  # GQA 3: an odd row count, head 96
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,seq_lens,query_lens", CASES)
def test_matches_reference(num_heads, num_kv_heads, head_dim, block_size, seq_lens, query_lens, dtype):
    seed = fresh_seed()
    query, k_cache, v_cache, meta = make_batch(seed, seq_lens, query_lens, num_heads, num_kv_heads, head_dim,
                                               block_size, dtype)
    scale = head_dim ** -0.5
    ref = paged_attention_ref(query, k_cache, v_cache, meta, scale)
    out = run_kernel(query, k_cache, v_cache, meta, scale)
    assert out.dtype == dtype
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"seed={seed} rel err {err}"


def test_bfloat16_close_to_float32():
    """The same inputs, rounded to bf16, give the float32 answer within bf16's precision."""
    seed = fresh_seed()
    query, k_cache, v_cache, meta = make_batch(seed, [90, 33, 7], [1, 20, 7], 8, 2, 64, 16, torch.float32)
    out32 = run_kernel(query, k_cache, v_cache, meta, 0.125)
    out16 = run_kernel(query.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), meta, 0.125)
    err = rel_err(out16, out32)
    assert err < 2e-2, f"seed={seed} rel err {err}"


def test_strided_query_and_output():
    """A query that is a view (head stride wider than head_dim), written into a view of a bigger output."""
    seed = fresh_seed()
    query, k_cache, v_cache, meta = make_batch(seed, [50, 23], [1, 23], 4, 2, 64, 16, torch.float32)
    wide = torch.randn(query.shape[0], 4, 96)
    wide[..., :64] = query
    big_out = torch.full((query.shape[0], 4, 80), float("nan"))
    out = paged_attention_cpu(wide[..., :64], k_cache, v_cache, meta.block_tables, meta.seq_lens,
                              meta.query_start_loc, 0.125, out=big_out[..., :64])
    ref = paged_attention_ref(query, k_cache, v_cache, meta, 0.125)
    assert rel_err(out, ref) < 1e-4, f"seed={seed}"
    assert torch.isnan(big_out[..., 64:]).all()  # nothing written outside the view


def test_bad_inputs_raise():
    query, k_cache, v_cache, meta = make_batch(0, [20], [1], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="dtypes"):
        paged_attention_cpu(query.half(), k_cache.half(), v_cache.half(), meta.block_tables, meta.seq_lens,
                            meta.query_start_loc, 0.125)
    with pytest.raises(ValueError, match="query's dtype"):
        paged_attention_cpu(query, k_cache.bfloat16(), v_cache.bfloat16(), meta.block_tables, meta.seq_lens,
                            meta.query_start_loc, 0.125)
    with pytest.raises(ValueError, match="block ids"):
        paged_attention_cpu(query, k_cache, v_cache, meta.block_tables + 1000, meta.seq_lens,
                            meta.query_start_loc, 0.125)
    with pytest.raises(ValueError, match="longer than its block table"):
        paged_attention_cpu(query, k_cache, v_cache, meta.block_tables, meta.seq_lens + 100,
                            meta.query_start_loc, 0.125)


def test_auto_picks_cpu_kernels_for_their_dtypes():
    assert get_backend("auto", "cpu").name == "cpu"
    assert get_backend("auto", "cpu", torch.bfloat16).name == "cpu"
    assert get_backend("auto", "cpu", torch.float16).name == "torch"  # the kernel has no fp16


MAX_NEW = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("llama_cpu"))


def run_ours(model_dir, prompts, **engine_args):
    llm = LLM(str(model_dir), **engine_args)
    assert llm.engine.runner.backend.name == "cpu"  # "auto" on the CPU
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    assert llm.engine.block_manager.check_no_leak() == []
    return llm, [o.token_ids for o in outs]


def test_greedy_parity_batched_and_chunked(model_dir):
    prompts = mixed_prompts()
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    assert run_ours(model_dir, prompts, max_num_seqs=8, max_num_batched_tokens=2048)[1] == expected
    # a 40-token budget: prefill chunks share steps with other sequences' decodes
    assert run_ours(model_dir, prompts, max_num_seqs=8, max_num_batched_tokens=40)[1] == expected


def test_greedy_parity_with_prefix_cache_hits(model_dir):
    shared = mixed_prompts(1, seed=5, lengths=(200,))[0]
    prompts = [shared + tail for tail in mixed_prompts(4, seed=6, lengths=(1, 5, 17, 40))]
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    llm, got = run_ours(model_dir, prompts, max_num_seqs=1, max_num_batched_tokens=512)
    assert llm.engine.block_manager.prefix_cache_hits > 0
    assert got == expected
