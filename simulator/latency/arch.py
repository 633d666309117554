"""A model's architecture from its Hugging Face config.json: what a step reads and computes.

Only the fields that size the work are read: hidden size, layers, heads and KV heads (GQA), head
dimension, MLP width (gated or not), vocabulary, tied embeddings, mixture-of-experts (experts,
active experts, shared experts, dense first layers) and multi-head latent attention (MLA, as in
DeepSeek-V3). Field names follow the model families' own configs (BLOOM's n_layer, OPT's ffn_dim, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# families whose MLP is gate * up -> down (three matrices); others (OPT, BLOOM) have two
GATED = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "gemma2",
    "phi3",
}
ALIASES = {
    "hidden_size": ("hidden_size", "n_embed", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "ffn": ("intermediate_size", "ffn_dim", "n_inner"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
}


def _get(cfg: dict, key: str, where: str, default=None):
    for name in ALIASES[key]:
        if cfg.get(name) is not None:
            return cfg[name]
    if default is not None:
        return default
    raise ValueError(f"{where}: config has none of {', '.join(ALIASES[key])}")


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width
    gated: bool
    vocab: int
    tied: bool
    max_len: int
    experts: int = 0  # routed experts (0: dense)
    active_experts: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # first layers with a dense MLP in an MoE model
    q_lora: int = 0  # MLA (0: plain multi-head / grouped-query attention)
    kv_lora: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    # --- per-GPU sizes at tensor-parallel degree tp (vLLM's sharding) -------------------------

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads a GPU holds: split across ranks, replicated when there are fewer heads than ranks."""
        return math.ceil(self.kv_heads / tp)

    def attn_params(self, tp: int) -> float:
        """Linear-layer parameters of one layer's attention on one GPU."""
        h = self.hidden
        if self.mla:  # q_a and kv_a are replicated on every rank; the per-head matrices are split
            q = (
                h * self.q_lora + self.q_lora * self.heads * (self.qk_nope + self.qk_rope) / tp
                if self.q_lora
                else h * self.heads * (self.qk_nope + self.qk_rope) / tp
            )
            kv = (
                h * (self.kv_lora + self.qk_rope)
                + self.kv_lora * self.heads * (self.qk_nope + self.v_head) / tp
            )
            return q + kv + self.heads * self.v_head * h / tp
        d = self.head_dim
        return h * self.heads * d / tp * 2 + 2 * h * self.kv_heads_per_gpu(tp) * d

    def mlp_params(self, tp: int) -> tuple[float, float]:
        """(stored, active per token) MLP parameters of the whole model on one GPU."""
        mats = 3 if self.gated else 2
        dense = mats * self.hidden * self.ffn / tp
        if not self.experts:
            return dense * self.layers, dense * self.layers
        expert = 3 * self.hidden * self.expert_ffn / tp
        router = self.hidden * self.experts
        per_moe_stored = expert * (self.experts + self.shared_experts) + router
        per_moe_active = expert * (self.active_experts + self.shared_experts) + router
        return (
            dense * self.dense_layers + per_moe_stored * self.moe_layers,
            dense * self.dense_layers + per_moe_active * self.moe_layers,
        )

    def routed_expert_params(self, tp: int) -> float:
        """Parameters of every routed expert of every MoE layer on one GPU (0 for a dense model)."""
        return 3 * self.hidden * self.expert_ffn / tp * self.experts * self.moe_layers

    def linear_params(self, tp: int) -> tuple[float, float]:
        """(stored, active per token) transformer-layer linear parameters on one GPU (no embeddings)."""
        stored, active = self.mlp_params(tp)
        attn = self.attn_params(tp) * self.layers
        return attn + stored, attn + active

    def embedding_params(self, tp: int) -> float:
        """Input embedding plus output head on one GPU (vocabulary-parallel; tied: stored once)."""
        return self.vocab * self.hidden / tp * (1 if self.tied else 2)

    def head_params(self, tp: int) -> float:
        return self.vocab * self.hidden / tp

    def total_params(self) -> float:
        stored, _ = self.linear_params(1)
        return stored + self.embedding_params(1)

    def kv_elems_per_token(self, tp: int) -> float:
        """KV-cache elements one token keeps on one GPU, all layers (MLA's latent is on every rank)."""
        if self.mla:
            return self.layers * (self.kv_lora + self.qk_rope)
        return self.layers * 2 * self.kv_heads_per_gpu(tp) * self.head_dim

    def attn_flops_per_pair(self, tp: int) -> float:
        """FLOPs of one (query, key) pair over all layers and this GPU's heads: QK^T and PV."""
        if self.mla:  # prefill runs MLA expanded: qk over nope+rope dims, pv over v dims
            return self.layers * 2 * (self.heads / tp) * (self.qk_nope + self.qk_rope + self.v_head)
        return self.layers * 4 * (self.heads / tp) * self.head_dim

    def decode_attn_flops_per_token(self, tp: int) -> float:
        """FLOPs of one decode query against one cached token (MLA absorbed: all on the latent)."""
        if self.mla:
            return self.layers * 2 * (self.heads / tp) * (2 * self.kv_lora + self.qk_rope)
        return self.attn_flops_per_pair(tp)


def arch_from_config(cfg: dict, name: str = "config") -> Arch:
    """An Arch from a config.json dictionary; a missing or impossible field is an error naming it."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: a config must be a JSON object")
    hidden, layers = int(_get(cfg, "hidden_size", name)), int(_get(cfg, "layers", name))
    heads = int(_get(cfg, "heads", name))
    mtype = str(cfg.get("model_type", ""))
    experts = int(_get(cfg, "experts", name, 0) or 0)
    ffn = int(_get(cfg, "ffn", name, 4 * hidden))  # BLOOM: 4 * hidden
    kw = {}
    if experts:
        kw = {
            "experts": experts,
            "active_experts": int(cfg.get("num_experts_per_tok", 2)),
            "expert_ffn": int(cfg.get("moe_intermediate_size") or ffn),
            "shared_experts": int(cfg.get("n_shared_experts") or 0),
            "dense_layers": int(cfg.get("first_k_dense_replace") or 0),
        }
    if cfg.get("kv_lora_rank"):
        kw.update(
            q_lora=int(cfg.get("q_lora_rank") or 0),
            kv_lora=int(cfg["kv_lora_rank"]),
            qk_nope=int(cfg["qk_nope_head_dim"]),
            qk_rope=int(cfg["qk_rope_head_dim"]),
            v_head=int(cfg["v_head_dim"]),
        )
    arch = Arch(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        ffn=ffn,
        gated=mtype in GATED,
        vocab=int(cfg["vocab_size"]) if "vocab_size" in cfg else 0,
        tied=bool(cfg.get("tie_word_embeddings", True)),  # the Hugging Face default is tied
        max_len=int(cfg.get("max_position_embeddings") or cfg.get("seq_length") or 2048),
        **kw,
    )
    bad = [
        k
        for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab")
        if getattr(arch, k) < 1
    ]
    if bad:
        raise ValueError(f"{name}: config field(s) {', '.join(bad)} missing or not positive")
    if heads % arch.kv_heads:
        raise ValueError(f"{name}: {heads} attention heads are not a multiple of {arch.kv_heads} KV heads")
    if experts and not 0 < arch.active_experts <= experts:
        raise ValueError(f"{name}: num_experts_per_tok must be in 1..{experts}")
    return arch
