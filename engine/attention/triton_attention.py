"""Triton paged-attention kernels: split-K decode (flash-decoding) and a variable-length prefill kernel.

Both read K/V through block tables from caches laid out [num_blocks, block_size, num_kv_heads, head_dim],
so a tile of BLOCK_N tokens is gathered token by token: any block size and any block order work.
Softmax runs in base 2 (scale pre-multiplied by log2(e)) with float32 accumulators.
"""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    # no GPU: run the kernels in Triton's interpreter (read when @triton.jit decorates, so set it first)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(cache_ptr, block_table_ptr, n, n_mask, d, d_mask, kv_head,
                  stride_b, stride_t, stride_h, BLOCK_SIZE: tl.constexpr):
    """[BLOCK_N, PADDED_D] tile of tokens n of one sequence, looked up block by block."""
    blk = tl.load(block_table_ptr + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    offs = blk[:, None] * stride_b + (n % BLOCK_SIZE)[:, None] * stride_t + kv_head * stride_h + d[None, :]
    return tl.load(cache_ptr + offs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """a @ b accumulated in float32; DOT_F32 widens 16-bit operands first (the interpreter's dot can't)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, mid_o_ptr, mid_lse_ptr,
    scale, split_len,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_mo_s, stride_mo_h, stride_mo_p,
    stride_ml_s, stride_ml_h,
    GROUP: tl.constexpr, PADDED_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PADDED_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    """One (sequence, kv head, split): all GROUP query heads of the kv head share each K/V tile."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, PADDED_GROUP)
    d = tl.arange(0, PADDED_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([PADDED_GROUP], float("-inf"), tl.float32)
    l_i = tl.zeros([PADDED_GROUP], tl.float32)
    acc = tl.zeros([PADDED_GROUP, PADDED_D], tl.float32)
    table = block_tables_ptr + seq * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        k = _load_kv_tile(k_ptr, table, n, n_mask, d, d_mask, kv_head, stride_kb, stride_kt, stride_kh,
                          BLOCK_SIZE)
        s = _dot(q, tl.trans(k), PRECISION, DOT_F32) * scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(v_ptr, table, n, n_mask, d, d_mask, kv_head, stride_vb, stride_vt, stride_vh,
                          BLOCK_SIZE)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, DOT_F32)
        m_i = m_new

    # an empty split (past the end of a short sequence) stores lse = -inf and weighs nothing in the merge
    has = l_i > 0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    mo = mid_o_ptr + seq * stride_mo_s + heads[:, None] * stride_mo_h + split * stride_mo_p + d[None, :]
    tl.store(mo, o, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(mid_lse_ptr + seq * stride_ml_s + heads * stride_ml_h + split, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, o_ptr, num_splits,
    stride_mo_s, stride_mo_h, stride_mo_p,
    stride_ml_s, stride_ml_h,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, PADDED_D: tl.constexpr, PADDED_SPLITS: tl.constexpr,
):
    """Combine the per-split softmax partials of one (sequence, head) by their log-sum-exp."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    p = tl.arange(0, PADDED_SPLITS)
    d = tl.arange(0, PADDED_D)
    p_mask = p < num_splits
    d_mask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + seq * stride_ml_s + head * stride_ml_h + p, mask=p_mask, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    o = tl.load(mid_o_ptr + seq * stride_mo_s + head * stride_mo_h + p[:, None] * stride_mo_p + d[None, :],
                mask=p_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(o_ptr + seq * stride_ot + head * stride_oh + d, out.to(o_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _varlen_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ot, stride_oh,
    stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PADDED_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """One (sequence, block of BLOCK_M query tokens, head): causal over cached prefix + the chunk itself."""
    seq = tl.program_id(0)
    qb = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if qb * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len
    kv_head = head // GROUP

    m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, PADDED_D)
    m_mask = m < q_len
    d_mask = d < HEAD_DIM
    q_pos = context + m
    q = tl.load(q_ptr + (q_start + m)[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, PADDED_D], tl.float32)
    table = block_tables_ptr + seq * stride_bt
    end = tl.minimum(seq_len, context + (qb + 1) * BLOCK_M)  # the last row of this block sees no further
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        k = _load_kv_tile(k_ptr, table, n, n_mask, d, d_mask, kv_head, stride_kb, stride_kt, stride_kh,
                          BLOCK_SIZE)
        s = _dot(q, tl.trans(k), PRECISION, DOT_F32) * scale
        s = tl.where(n_mask[None, :] & (n[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: position 0 is visible to every row
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(v_ptr, table, n, n_mask, d, d_mask, kv_head, stride_vb, stride_vt, stride_vh,
                          BLOCK_SIZE)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, DOT_F32)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o_ptr + (q_start + m)[:, None] * stride_ot + head * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _precision(dtype: torch.dtype) -> str:
    # float32 must stay float32 (the 1e-3 check); tf32 would round the inputs to 10 bits
    return "ieee" if dtype == torch.float32 else "tf32"


def _dot_f32(dtype: torch.dtype) -> bool:
    # Triton's interpreter multiplies bfloat16 bit patterns in tl.dot (triton-lang/triton#11584)
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      target_programs: int = 256, min_split_tokens: int = 256, max_splits: int = 64) -> int:
    """Enough splits to fill the GPU when the batch is small, never splits shorter than min_split_tokens."""
    by_occupancy = triton.cdiv(target_programs, max(1, num_seqs * num_kv_heads))
    by_length = triton.cdiv(max_seq_len, max(min_split_tokens, block_n))
    return max(1, min(by_occupancy, by_length, max_splits))


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, scale: float,
                 out: torch.Tensor | None = None, num_splits: int | None = None,
                 block_n: int = 32) -> torch.Tensor:
    """One new token per sequence: query [num_seqs, num_heads, head_dim] -> same shape."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, block_n)
    split_len = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_seq_len, split_len)
    mid_o = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    mid_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    padded_d = triton.next_power_of_2(head_dim)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, mid_o, mid_lse,
        scale * LOG2E, split_len,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, PADDED_GROUP=max(16, triton.next_power_of_2(group)),  # tl.dot needs M >= 16
        HEAD_DIM=head_dim, PADDED_D=padded_d, BLOCK_SIZE=block_size, BLOCK_N=block_n,
        PRECISION=_precision(query.dtype), DOT_F32=_dot_f32(query.dtype),
    )
    _decode_merge_kernel[(num_seqs, num_heads)](
        mid_o, mid_lse, out, num_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, PADDED_D=padded_d, PADDED_SPLITS=max(2, triton.next_power_of_2(num_splits)),
    )
    return out


def paged_varlen(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                 max_query_len: int, scale: float, out: torch.Tensor | None = None,
                 block_m: int = 32, block_n: int = 32) -> torch.Tensor:
    """Prefill chunks and decodes in one flat batch: query [num_tokens, num_heads, head_dim]."""
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    _, block_size, num_kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    grid = (num_seqs, math.ceil(max_query_len / block_m), num_heads)
    _varlen_kernel[grid](
        query, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        scale * LOG2E,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, PADDED_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=_precision(query.dtype),
        DOT_F32=_dot_f32(query.dtype),
    )
    return out
