"""attention_backend="cpu": the C++ paged kernels of csrc/paged_kernels.cpp (pybind11, built in place).

One kernel call covers the whole mixed batch (decodes and prefill chunks). It takes raw pointers, so
every check on dtypes, devices, shapes and strides is made here before the call.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import write_kv_ref

try:  # after torch: the kernel's OpenMP then binds to the runtime torch already loaded
    from engine import _paged_kernels
except ImportError:  # not built (no compiler at install time)
    _paged_kernels = None

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
MAX_GROUP = 32  # query heads per kv head the kernel takes


def kernels_available() -> bool:
    return _paged_kernels is not None


def _int32(t: torch.Tensor) -> torch.Tensor:
    t = t.to(torch.int32)
    return t if t.stride(-1) == 1 or t.numel() == 0 else t.contiguous()


def check_metadata(block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                   num_tokens: int, num_blocks: int, block_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's int32 views of the metadata, once they are known to stay inside the cache."""
    num_seqs = seq_lens.shape[0]
    block_tables, seq_lens, query_start_loc = _int32(block_tables), _int32(seq_lens), _int32(query_start_loc)
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError("cpu backend: block_tables, seq_lens and query_start_loc disagree on num_seqs")
    if int(query_start_loc[-1]) != num_tokens:
        raise ValueError(f"query_start_loc ends at {int(query_start_loc[-1])}, query has {num_tokens} tokens")
    if num_seqs and int(seq_lens.max()) > block_tables.shape[1] * block_size:
        raise ValueError("cpu backend: a sequence is longer than its block table covers")
    if block_tables.numel() and not 0 <= int(block_tables.min()) <= int(block_tables.max()) < num_blocks:
        raise ValueError(f"cpu backend: block ids outside the cache's {num_blocks} blocks")
    return block_tables, seq_lens, query_start_loc


def paged_attention_cpu(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, out: torch.Tensor | None = None, checked: bool = False) -> torch.Tensor:
    """query [num_tokens, heads, head_dim] -> same shape, through block tables (see AttentionMetadata).

    checked: the metadata already came through check_metadata for a cache of this shape."""
    if _paged_kernels is None:
        raise RuntimeError("the CPU paged kernels are not built (run `make native`)")
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if query.dtype not in DTYPE_CODES:
        raise ValueError(f"cpu backend supports dtypes {list(DTYPE_CODES)}, got {query.dtype}")
    if not (k_cache.dtype == v_cache.dtype == query.dtype) or k_cache.shape != v_cache.shape:
        raise ValueError("cpu backend needs K and V caches of one shape and of the query's dtype")
    if cache_dim != head_dim or num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GROUP:
        raise ValueError(f"cpu backend: {num_heads} query heads of {head_dim} over {num_kv_heads} kv heads "
                         f"of {cache_dim} (a multiple, at most {MAX_GROUP} per kv head)")
    if out is None:
        out = torch.empty_like(query)
    tensors = (query, k_cache, v_cache, out)
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("cpu backend needs CPU tensors")
    if any(t.stride(-1) != 1 for t in tensors) or k_cache.stride() != v_cache.stride() or \
            out.dtype != query.dtype or out.shape != query.shape:
        raise ValueError("cpu backend needs head_dim contiguous, one K/V layout and out shaped like query")
    if not checked:
        block_tables, seq_lens, query_start_loc = check_metadata(block_tables, seq_lens, query_start_loc,
                                                                 query.shape[0], k_cache.shape[0], block_size)
    num_seqs = seq_lens.shape[0]
    _paged_kernels.paged_attention(
        out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), query_start_loc.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim,
        block_size, block_tables.stride(0), query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale, DTYPE_CODES[query.dtype],
        torch.get_num_threads())
    return out


class CpuBackend:
    name = "cpu"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        if self.device.type != "cpu":
            raise ValueError(f"attention_backend='cpu' needs the CPU, got {self.device}")
        if _paged_kernels is None:
            raise ValueError("attention_backend='cpu' needs the C++ paged kernels, which are not built "
                             "(run `make native`)")
        self._meta: AttentionMetadata | None = None
        self._tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = ()

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        # every layer of a step shares one metadata: its checks and int32 copies are made once
        if self._meta is not meta:
            self._tables = check_metadata(meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                          query.shape[0], k_cache.shape[0], k_cache.shape[1])
            self._meta = meta
        return paged_attention_cpu(query, k_cache, v_cache, *self._tables, scale, out=out, checked=True)
