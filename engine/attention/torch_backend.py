"""Reference paged attention in plain torch: clear rather than fast, one masked SDPA per sequence."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


def write_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V [num_tokens, kv_heads, head_dim] into [blocks, block_size, kv_heads, head_dim]."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len cached tokens of one sequence, [seq_len, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def paged_attention_ref(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """query [num_tokens, heads, head_dim] -> same shape; K/V read through the block tables.

    Computed in float32 so it can serve as the reference for lower-precision kernels.
    """
    num_heads = query.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    start = 0
    for s, (seq_len, q_len) in enumerate(zip(meta.seq_lens_list, meta.query_lens_list)):
        q = query[start:start + q_len].float().transpose(0, 1)  # [heads, q_len, d]
        k = gather_kv(k_cache, meta.block_tables[s], seq_len).float()
        v = gather_kv(v_cache, meta.block_tables[s], seq_len).float()
        # GQA: query head h reads kv head h // group
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq_len, d]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        kv_pos = torch.arange(seq_len, device=query.device)
        mask = kv_pos[None, :] <= q_pos[:, None]  # [q_len, seq_len], True = attend
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[start:start + q_len] = o.transpose(0, 1).to(query.dtype)
        start += q_len
    return out


def batched_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Single-token queries of many sequences [S, heads, d] in one padded, masked SDPA call."""
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    num_blocks = (max_len + block_size - 1) // block_size
    blocks = block_tables[:, :num_blocks].long()
    length = num_blocks * block_size
    k = k_cache[blocks].view(num_seqs, length, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache[blocks].view(num_seqs, length, num_kv_heads, head_dim).transpose(1, 2)
    mask = torch.arange(length, device=query.device)[None, :] < seq_lens[:, None].long()  # True = attend
    pad = ~mask[:, None, :, None]  # padding slots may hold anything, even NaN
    k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
    q = query.unsqueeze(2)  # [S, heads, 1, d]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale,
                                         enable_gqa=num_heads != num_kv_heads)
    return out.squeeze(2)


def prefill_one(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                seq_len: int, scale: float) -> torch.Tensor:
    """One sequence's chunk [q_len, heads, d], causal, over its cached prefix and itself."""
    q_len, num_heads = query.shape[0], query.shape[1]
    k = gather_kv(k_cache, block_table, seq_len).transpose(0, 1)  # [kv_heads, seq_len, d]
    v = gather_kv(v_cache, block_table, seq_len).transpose(0, 1)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
    mask = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(query.transpose(0, 1), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=num_heads != k.shape[0])
    return out.transpose(0, 1)


class TorchBackend:
    """The reference's semantics, batched: all decodes in one call, then each prefill chunk."""

    name = "torch"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        starts = meta.query_start_loc.tolist()
        decodes = [s for s, q_len in enumerate(meta.query_lens_list) if q_len == 1]
        out = torch.empty_like(query)
        if decodes:
            rows = torch.tensor([starts[s] for s in decodes], device=query.device)
            idx = torch.tensor(decodes, device=query.device)
            out[rows] = batched_decode(query[rows], k_cache, v_cache, meta.block_tables[idx],
                                       meta.seq_lens[idx], scale).to(query.dtype)
        for s, q_len in enumerate(meta.query_lens_list):
            if q_len > 1:
                a = starts[s]
                out[a:a + q_len] = prefill_one(query[a:a + q_len], k_cache, v_cache, meta.block_tables[s],
                                               meta.seq_lens_list[s], scale).to(query.dtype)
        return out
