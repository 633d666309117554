"""Rotary position embeddings, including Llama-3 frequency scaling, computed the way transformers does."""

from __future__ import annotations

import math
from typing import Any

import torch


def inv_frequencies(head_dim: int, theta: float, rope_scaling: dict[str, Any] | None = None) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (rope_scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, rope_scaling)
    raise ValueError(f"rope_type {rope_type!r} unsupported")


def _llama3_scale(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended smoothly.
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """A cos/sin table over all positions, built once on the model's device."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, rope_scaling: dict[str, Any] | None,
                 device: torch.device | str = "cpu"):
        inv_freq = inv_frequencies(head_dim, theta, rope_scaling).to(device)
        freqs = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [positions, head_dim], rotate-half layout
        self.cos = emb.cos()
        self.sin = emb.sin()
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, d] of the token positions [T]: gathered once per forward, shared by the layers."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, heads, d], k [T, kv_heads, d] rotated by their token positions [T]."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] (any strides) rotated: x * cos + rotate_half(x) * sin, with transformers'
    roundings (each product and the sum rounded to x's dtype), in three passes instead of five.

    rotate_half(x) = cat(-x2, x1), so the first half is x1 * cos1 - x2 * sin1 and the second
    x2 * cos2 + x1 * sin2 (adding a negated product is subtracting it, exactly)."""
    half = x.shape[-1] // 2
    out = torch.mul(x, cos)
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out
