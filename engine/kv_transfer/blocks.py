"""A runner's KV blocks as bytes and back: the layout the handshake compares, gather and scatter.

The payload for blocks B is one tensor [num_layers, 2 (K, V), len(B), block_size, kv_heads, head_dim]
in the cache dtype, sent as raw bytes.
"""

from __future__ import annotations

from typing import Any

import torch


def kv_layout(runner, kv_bytes_per_token: float | None = None) -> dict[str, Any]:
    """What two engines must share to move blocks; an emulated engine (no KV caches) has its block
    size and modelled bytes per token only, and never pairs with a real one."""
    if not hasattr(runner, "kv_caches"):
        return {"block_size": runner.block_size, "dtype": "emulated",
                "kv_bytes_per_token": kv_bytes_per_token}
    c = runner.config
    return {"block_size": runner.block_size, "dtype": str(runner.dtype).removeprefix("torch."),
            "num_layers": c.num_layers, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}


def gather(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_ids: list[int]) -> bytes:
    if not block_ids:
        return b""
    idx = torch.tensor(block_ids, dtype=torch.int64, device=kv_caches[0][0].device)
    out = torch.stack([torch.stack((k.index_select(0, idx), v.index_select(0, idx))) for k, v in kv_caches])
    return out.cpu().contiguous().view(torch.uint8).numpy().tobytes()


def scatter(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_ids: list[int],
            payload: bytes | bytearray) -> None:
    """Writes the payload of gather() into these blocks; ValueError if its size does not fit."""
    if not block_ids:
        return
    k0 = kv_caches[0][0]
    shape = (len(kv_caches), 2, len(block_ids), *k0.shape[1:])
    expected = len(kv_caches) * 2 * len(block_ids) * k0[0].numel() * k0.element_size()
    if len(payload) != expected:
        raise ValueError(f"KV payload has {len(payload)} bytes, expected {expected} for "
                         f"{len(block_ids)} blocks")
    data = torch.frombuffer(payload, dtype=torch.uint8).view(k0.dtype).reshape(shape).to(k0.device)
    idx = torch.tensor(block_ids, dtype=torch.int64, device=k0.device)
    for layer, (k, v) in enumerate(kv_caches):
        k.index_copy_(0, idx, data[layer, 0])
        v.index_copy_(0, idx, data[layer, 1])
