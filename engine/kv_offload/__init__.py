"""A second, larger KV tier (host memory) behind the device prefix cache, as vLLM's native CPU
offloading: evicted prefix blocks are copied there, kept by LRU, and copied back on a prefix hit.

`--kv-offloading-size` (GiB) and `--kv-offloading-backend` are vLLM's flags. The real runner keeps
a host tensor pool (copier.TensorCopier); the emulated runner only charges the copy time at a
PCIe-class bandwidth (tier.TimedCopier). Docs: docs/kv_tiers.md.
"""

from __future__ import annotations

from engine.kv_offload.lru import OffloadIndex
from engine.kv_offload.tier import OffloadTier, TimedCopier

BACKENDS = ("native",)  # vLLM also takes "lmcache" (an external server): not in this engine
# Host <-> GPU over PCIe Gen5 x16: 128 GB/s both ways together, 64 GB/s each way (NVIDIA H100
# datasheet, PCIe column; the GPU sheet h100-pcie's link_gbs). H100 SXM's host link is the same PCIe.
DEFAULT_BANDWIDTH_GBS = 64.0
GIB = 1 << 30


def offload_error(size_gib: float | None, backend: str, prefix_caching: bool) -> str | None:
    """Why these offloading settings are invalid (None: they are fine)."""
    if backend not in BACKENDS:
        other = " ('lmcache' needs an LMCache server, which this engine does not drive)" \
            if backend == "lmcache" else ""
        return (f"--kv-offloading-backend must be one of {', '.join(BACKENDS)}, got {backend!r}{other}")
    if size_gib is None:
        return None
    if not isinstance(size_gib, (int, float)) or not 0 < size_gib < float("inf"):
        return f"--kv-offloading-size must be a positive number of GiB, got {size_gib!r}"
    if not prefix_caching:
        return ("--kv-offloading-size needs prefix caching (the tier is keyed by prefix-block hashes); "
                "drop --no-prefix-caching")
    return None


def num_slots(size_gib: float, block_bytes: int) -> int:
    """How many KV blocks size_gib of host memory holds; a clear error when not even one."""
    slots = int(size_gib * GIB // block_bytes)
    if slots < 1:
        raise ValueError(f"--kv-offloading-size {size_gib} GiB is smaller than one KV block "
                         f"({block_bytes} bytes)")
    return slots


def build_tier(size_gib: float, runner) -> OffloadTier:
    """The tier for a runner: it says its block size in bytes and makes the copier for n slots."""
    block_bytes = runner.kv_block_bytes
    if not block_bytes:
        raise ValueError("--kv-offloading-size: this engine does not know its KV bytes per block "
                         "(an emulated engine needs a derived latency model or a preset model name)")
    slots = num_slots(size_gib, block_bytes)
    return OffloadTier(slots, block_bytes, runner.offload_copier(slots))


__all__ = ["BACKENDS", "DEFAULT_BANDWIDTH_GBS", "OffloadIndex", "OffloadTier", "TimedCopier", "build_tier",
           "num_slots", "offload_error"]
