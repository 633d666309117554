"""Paged-attention backends behind one interface: write new K/V, then attend through block tables.

Caches are per layer, K and V each [num_blocks, block_size, num_kv_heads, head_dim].
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata, build_metadata
from engine.attention.torch_backend import TorchBackend, paged_attention_ref, write_kv_ref

__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "build_metadata", "get_backend",
           "paged_attention_ref", "write_kv_ref"]

BACKENDS = ("auto", "torch", "cpu", "triton", "cuda")


class AttentionBackend(Protocol):
    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """key/value [num_tokens, num_kv_heads, head_dim] -> cache slots slot_mapping."""

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> attention output of the same shape."""


def get_backend(name: str, device: torch.device | str = "cpu",
                dtype: torch.dtype | None = None) -> AttentionBackend:
    """dtype: the model's, so that "auto" picks a backend that supports it."""
    device = torch.device(device)
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu" if _cpu_kernels_fit(dtype) else "torch"
    if name == "torch":
        return TorchBackend(device)
    if name == "cpu":
        from engine.attention.cpu_backend import CpuBackend

        return CpuBackend(device)
    if name == "triton":
        from engine.attention.triton_backend import TritonBackend  # other engineer's file, imported lazily

        return TritonBackend(device)
    if name == "cuda":
        from engine.attention.cuda_backend import CudaBackend

        return CudaBackend(device)
    raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(BACKENDS)}")


def _cpu_kernels_fit(dtype: torch.dtype | None) -> bool:
    from engine.attention.cpu_backend import DTYPE_CODES, kernels_available

    return kernels_available() and (dtype is None or dtype in DTYPE_CODES)
