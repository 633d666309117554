"""attention_backend="cuda": the paged decode kernel of csrc/paged_attention.cu, called through ctypes.

The .cu file needs nvcc only (no torch headers). It is built on first use for the GPU's architecture and
cached by source hash and arch; one that setup.py prebuilt into engine/ for this source is used first.
Steps with prefill chunks go to the Triton varlen kernel: the CUDA kernel covers decode only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import write_kv_ref

SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "paged_attention.cu"
PREBUILT_DIR = Path(__file__).resolve().parents[1]  # engine/, where setup.py puts its build
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
HEAD_DIMS = (64, 128, 256)

_lib: ctypes.CDLL | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("SLOPILOT_CACHE", Path.home() / ".cache" / "slopilot"))


def nvcc_command(source: Path, output: Path, arch: str, shared: bool = True) -> list[str]:
    """nvcc line for the library (shared) or a compile-only object; arch like "90" for sm_90."""
    nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    cmd = [nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", str(output)]
    cmd += ["-shared", "-Xcompiler", "-fPIC"] if shared else ["-c"]
    return cmd + [str(source)]


def library_name(arch: str, source: Path = SOURCE) -> str:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    return f"_paged_attention_{digest}_sm{arch}.so"


def build_library(arch: str, out_dir: Path | None = None, source: Path = SOURCE) -> Path:
    """Compile the kernel into a shared library (cached by source hash and arch); returns its path."""
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / library_name(arch, source)
    if not output.exists():
        tmp = output.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run(nvcc_command(source, tmp, arch), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source}:\n{result.stderr[-4000:]}")
        tmp.replace(output)  # atomic: concurrent builders never load a half-written file
    return output


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.slopilot_partition_size.restype = ctypes.c_int
    lib.slopilot_paged_decode.restype = ctypes.c_int
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.slopilot_paged_decode.argtypes = (
        [ptr] * 8 + [i32] * 7 + [i64] * 7 + [ctypes.c_float, i32, ptr]
    )
    return lib


def get_library() -> ctypes.CDLL:
    """The kernel library for the current GPU, built on first call."""
    global _lib
    if _lib is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
        prebuilt = PREBUILT_DIR / library_name(arch)
        _lib = load_library(prebuilt if prebuilt.exists() else build_library(arch))
    return _lib


def paged_decode_cuda(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, scale: float,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """query [num_seqs, num_heads, head_dim] (one token per sequence) -> same shape."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if query.dtype not in DTYPE_CODES or head_dim not in HEAD_DIMS:
        raise ValueError(f"cuda backend supports dtypes {list(DTYPE_CODES)} and head sizes {HEAD_DIMS}, "
                         f"got {query.dtype} and {head_dim}")
    if not (k_cache.dtype == v_cache.dtype == query.dtype) or k_cache.stride() != v_cache.stride():
        raise ValueError("cuda backend needs K and V caches of the query's dtype and one layout")
    for t in (query, k_cache):
        # a lane reads head_dim // 32 contiguous elements in one aligned access
        vec = head_dim // 32
        misaligned = t.data_ptr() % (vec * t.element_size()) or any(s % vec for s in t.stride()[:-1])
        if t.stride(-1) != 1 or misaligned:
            raise ValueError("cuda backend needs head_dim contiguous and strides aligned to head_dim / 32")
    if out is None:
        out = torch.empty_like(query)
    lib = get_library()
    max_parts = max(1, -(-max_seq_len // lib.slopilot_partition_size()))
    part_out = torch.empty(num_seqs, num_heads, max_parts, head_dim, dtype=torch.float32, device=query.device)
    part_lse = torch.empty(num_seqs, num_heads, max_parts, dtype=torch.float32, device=query.device)
    block_tables = block_tables.to(torch.int32)
    seq_lens = seq_lens.to(torch.int32).contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    err = lib.slopilot_paged_decode(
        out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), seq_lens.data_ptr(), part_out.data_ptr(), part_lse.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, block_size, block_tables.stride(0), max_parts,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        scale, DTYPE_CODES[query.dtype], torch.cuda.current_stream(query.device).cuda_stream,
    )
    if err != 0:
        raise RuntimeError(f"slopilot_paged_decode failed with cudaError {err}")
    return out


class CudaBackend:
    name = "cuda"

    def __init__(self, device: torch.device | str = "cuda"):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"attention_backend='cuda' needs a CUDA device, got {self.device}")

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        if meta.max_query_len == 1:
            return paged_decode_cuda(query.contiguous(), k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                     meta.max_seq_len, scale, out=out)
        from engine.attention.triton_attention import paged_varlen

        return paged_varlen(query.contiguous(), k_cache, v_cache, meta.block_tables, meta.seq_lens,
                            meta.query_start_loc, meta.max_query_len, scale, out=out)
