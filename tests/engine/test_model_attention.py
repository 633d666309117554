"""The torch paged-attention reference against dense causal attention on unpaged K/V."""

import math
import random

import pytest
import torch

from engine.attention import build_metadata, get_backend, paged_attention_ref


def dense_attention(q, k, v, scale):
    """q [q_len, H, d] at the last q_len positions of k/v [seq_len, KVH, d]; plain softmax, no SDPA."""
    q_len, heads, _ = q.shape
    seq_len, kv_heads, _ = k.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    for h in range(heads):
        scores = q[:, h] @ k[:, h // group].T * scale
        for j in range(q_len):
            scores[j, seq_len - q_len + j + 1:] = -math.inf
        out[:, h] = torch.softmax(scores, dim=-1) @ v[:, h // group]
    return out


def make_batch(seq_lens, query_lens, block_size=4, heads=4, kv_heads=2, head_dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(need) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)  # scattered, non-monotonic block tables
    tables, at = [], 0
    for n in need:
        tables.append(ids[at:at + n])
        at += n
    k_full = [torch.randn(n, kv_heads, head_dim, generator=g) for n in seq_lens]
    v_full = [torch.randn(n, kv_heads, head_dim, generator=g) for n in seq_lens]
    q = torch.randn(sum(query_lens), heads, head_dim, generator=g)
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    # fill the "already cached" prefix through a first write, then the new tokens through the backend
    prefix_lens = [n - ql for n, ql in zip(seq_lens, query_lens)]
    backend = get_backend("torch", "cpu")
    pre = [(t, p) for t, p in zip(tables, prefix_lens)]
    for (table, p), kf, vf in zip(pre, k_full, v_full):
        if p:
            m = build_metadata([table], [p], [p], block_size)
            backend.write_kv(kf[:p], vf[:p], k_cache, v_cache, m.slot_mapping)
    meta = build_metadata(tables, list(seq_lens), list(query_lens), block_size)
    new_k = torch.cat([kf[p:] for kf, p in zip(k_full, prefix_lens)])
    new_v = torch.cat([vf[p:] for vf, p in zip(v_full, prefix_lens)])
    backend.write_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    return q, k_cache, v_cache, meta, k_full, v_full


@pytest.mark.parametrize("seq_lens,query_lens", [
    ([5], [5]),  # one prefill
    ([9], [1]),  # one decode
    ([7, 13, 1, 16], [7, 1, 1, 5]),  # prefill + decodes + a chunked prefill continuation
    ([4, 8, 12], [4, 8, 3]),  # exact block boundaries
    ([3, 17, 9, 30], [1, 1, 1, 1]),  # decodes of very different lengths (padded batch)
])
def test_paged_ref_matches_dense(seq_lens, query_lens):
    q, k_cache, v_cache, meta, k_full, v_full = make_batch(seq_lens, query_lens)
    scale = 8 ** -0.5
    out = paged_attention_ref(q, k_cache, v_cache, meta, scale)
    assert out.shape == q.shape
    batched = get_backend("torch", "cpu").forward(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(batched, out, rtol=1e-5, atol=1e-5)
    start = 0
    for n, ql, kf, vf in zip(seq_lens, query_lens, k_full, v_full):
        want = dense_attention(q[start:start + ql], kf, vf, scale)
        torch.testing.assert_close(out[start:start + ql], want, rtol=1e-5, atol=1e-5)
        start += ql
    assert not torch.isnan(out).any()  # unused (NaN) cache slots were never read


def test_metadata_layout():
    meta = build_metadata([[3, 1], [0]], seq_lens=[6, 2], query_lens=[2, 1], block_size=4)
    # seq 0 new tokens at positions 4,5 -> block 1 offsets 0,1; seq 1 position 1 -> block 0 offset 1
    assert meta.slot_mapping.tolist() == [4, 5, 1]
    assert meta.block_tables.tolist() == [[3, 1], [0, 0]]
    assert meta.block_tables.dtype == torch.int32 and meta.slot_mapping.dtype == torch.int64
    assert meta.query_start_loc.tolist() == [0, 2, 3]
    assert meta.seq_lens.tolist() == [6, 2]
    assert (meta.max_query_len, meta.max_seq_len) == (2, 6)


def test_metadata_rejects_short_block_table():
    with pytest.raises(ValueError, match="cannot hold"):
        build_metadata([[0]], seq_lens=[5], query_lens=[1], block_size=4)


def test_get_backend_names():
    from engine.attention.cpu_backend import kernels_available

    assert get_backend("auto", "cpu").name == ("cpu" if kernels_available() else "torch")  # the C++ kernel
    assert get_backend("torch", "cpu").name == "torch"
    with pytest.raises(ValueError, match="torch"):
        get_backend("flash", "cpu")
