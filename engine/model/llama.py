"""Llama decoder over a flat, unpadded batch of tokens, with paged K/V caches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.model.bf16 import Linear
from engine.model.config import ModelConfig
from engine.model.rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in float32, scale in the model dtype (as transformers does)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    """q, k and v come from one fused matmul (qkv_proj: their weights stacked by rows, as the
    checkpoint's q_proj, k_proj, v_proj load into it), and RoPE turns q and k in one pass."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        bias = cfg.attention_bias
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, rope_cs: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        qk = apply_rope(qkv[:, :self.q_size + self.kv_size].view(t, self.num_heads + self.num_kv_heads,
                                                                 self.head_dim), *rope_cs)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        o = backend.forward(q.contiguous(), k_cache, v_cache, meta, self.scale)
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    """gate and up from one fused matmul (gate_up_proj: gate_proj's rows, then up_proj's)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.intermediate_size = i
        self.gate_up_proj = Linear(h, 2 * i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        i = self.intermediate_size
        return self.down_proj(F.silu(gate_up[:, :i]) * gate_up[:, i:])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope_cs, kv_cache, meta, backend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope_cs, kv_cache, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# checkpoint projections stacked into one fused parameter: (fused module, checkpoint module) by rows
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class LlamaForCausalLM(nn.Module):
    """Parameter names follow transformers' LlamaForCausalLM, except the fused projections:
    checkpoint_parameters() maps each checkpoint tensor to its rows of the fused parameter."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope: RotaryEmbedding | None = None  # built on the device once the weights are there

    def init_rope(self, device: torch.device | str) -> None:
        c = self.config
        self.rope = RotaryEmbedding(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling,
                                    device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        if self.rope is None:
            self.init_rope(input_ids.device)
        x = self.model.embed_tokens(input_ids)
        rope_cs = self.rope.cos_sin(positions, x.dtype)  # the same for every layer
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, rope_cs, kv_cache, meta, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def checkpoint_parameters(self) -> dict[str, torch.Tensor]:
        """transformers' parameter name -> this model's tensor for it (a row slice of a fused
        parameter for q/k/v and gate/up), in transformers' order; tied lm_head left out."""
        c = self.config
        rows = {"q_proj": c.num_heads * c.head_dim, "k_proj": c.num_kv_heads * c.head_dim,
                "v_proj": c.num_kv_heads * c.head_dim, "gate_proj": c.intermediate_size,
                "up_proj": c.intermediate_size}
        out: dict[str, torch.Tensor] = {}
        for name, p in self.named_parameters():  # a tied lm_head.weight is listed once, as the embedding
            module, _, kind = name.rpartition(".")
            prefix, _, fused = module.rpartition(".")
            if fused not in STACKED:
                out[name] = p
                continue
            start = 0
            for part in STACKED[fused]:
                out[f"{prefix}.{part}.{kind}"] = p[start:start + rows[part]]
                start += rows[part]
        return out
