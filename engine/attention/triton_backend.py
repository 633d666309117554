"""attention_backend="triton": split-K decode kernel for pure-decode steps, varlen kernel otherwise."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import write_kv_ref
from engine.attention.triton_attention import paged_decode, paged_varlen


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class TritonBackend:
    name = "triton"

    def __init__(self, device: torch.device | str = "cpu", num_splits: int | None = None):
        self.device = torch.device(device)
        self.num_splits = num_splits  # None: chosen per step from batch size and context length

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        # a scatter of whole rows: index_copy_ is already one bandwidth-bound kernel
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        query = _last_dim_contiguous(query)
        k_cache, v_cache = _last_dim_contiguous(k_cache), _last_dim_contiguous(v_cache)
        if meta.max_query_len == 1:
            return paged_decode(query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.max_seq_len,
                                scale, out=out, num_splits=self.num_splits)
        return paged_varlen(query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                            meta.max_query_len, scale, out=out)
