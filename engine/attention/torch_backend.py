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


class TorchBackend:
    name = "torch"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention_ref(query, k_cache, v_cache, meta, scale)
