"""The CUDA decode kernel (csrc/paged_attention.cu) against the torch reference; needs a GPU.

Where no GPU is present these tests skip; tests/engine/test_nvcc_compile.py still compiles the kernel.
bench/gpu/run.sh runs this file on the GPU machine.
"""

import pytest
import torch
from test_kernels_triton import fresh_seed, make_batch, poisoned, rel_err

from engine.attention import paged_attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [
    # (num_heads, num_kv_heads, head_dim, block_size, seq_lens)
    (8, 8, 64, 16, [1, 37, 300, 1000]),  # GQA 1, partitions of 256 with a partial tail
    (32, 8, 128, 16, [5, 4100, 700]),  # GQA 4, llama3-8b heads
    (16, 2, 128, 32, [19, 2000, 257, 256]),  # GQA 8, partition edges
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,seq_lens", CASES)
def test_cuda_decode_matches_reference(num_heads, num_kv_heads, head_dim, block_size, seq_lens, dtype):
    from engine.attention.cuda_backend import CudaBackend

    seed = fresh_seed()
    query, k_cache, v_cache, meta = make_batch(seed, seq_lens, [1] * len(seq_lens), num_heads, num_kv_heads,
                                               head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    ref = paged_attention_ref(query, k_cache, v_cache, meta, scale)
    out = CudaBackend("cuda").forward(query, k_cache, v_cache, meta, scale, out=poisoned(query))
    err = rel_err(out, ref)
    assert err < (1e-3 if dtype == torch.float32 else 1e-2), f"seed={seed} {dtype} rel err {err}"


def test_cuda_backend_mixed_batch_uses_varlen():
    from engine.attention.cuda_backend import CudaBackend

    seed = fresh_seed()
    query, k_cache, v_cache, meta = make_batch(seed, [90, 40, 7], [30, 1, 7], 8, 2, 128, 16, torch.bfloat16)
    ref = paged_attention_ref(query, k_cache, v_cache, meta, 0.1)
    out = CudaBackend("cuda").forward(query, k_cache, v_cache, meta, 0.1, out=poisoned(query))
    assert rel_err(out, ref) < 1e-2, f"seed={seed}"
