"""Llama-family model shape, read from a Hugging Face config.json or taken from a named preset."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None, or {"rope_type": "linear"|"llama3", "factor": ..., ...} as transformers spells it
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int = 1
    eos_token_ids: tuple[int, ...] = field(default=(2,))

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_attention_heads ({self.num_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: head_dim must be even for RoPE, got {self.head_dim}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"{self.name}: rope_type {rope_type!r} unsupported; "
                             f"valid: {', '.join(ROPE_TYPES)}")
        for tok in (self.bos_token_id, *self.eos_token_ids):
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"{self.name}: special token id {tok} outside the vocabulary "
                                 f"({self.vocab_size})")

    @property
    def eos_token_id(self) -> int:
        return self.eos_token_ids[0]

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * self.num_heads * self.head_dim * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "model") -> ModelConfig:
        """Accepts transformers 4.x spelling (rope_theta + rope_scaling) and 5.x (rope_parameters)."""
        def need(key: str) -> Any:
            if key not in d:
                raise ValueError(f"{name}: config.json lacks required field {key!r}")
            return d[key]

        arch = d.get("model_type", "llama")
        if arch not in ("llama",):
            raise ValueError(f"{name}: config.json model_type {arch!r} is not a Llama-family model")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{name}: config.json hidden_act {d['hidden_act']!r} unsupported (only silu)")
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
        rope_type = rope.pop("rope_type", rope.pop("type", "default"))
        rope_scaling = None if rope_type == "default" else {"rope_type": rope_type, **rope}
        if rope_type == "llama3":
            rope_scaling.setdefault("original_max_position_embeddings", int(need("max_position_embeddings")))
            for key in ("factor", "low_freq_factor", "high_freq_factor"):
                if key not in rope_scaling:
                    raise ValueError(f"{name}: config.json llama3 rope scaling lacks field {key!r}")
        eos = d.get("eos_token_id", 2)
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        bos = d.get("bos_token_id")
        return cls(
            name=name,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=int(bos if bos is not None else 1),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ValueError(f"{path}: no config.json (expected a model directory or a preset: "
                             f"{', '.join(PRESETS)})")
        try:
            d = json.loads(cfg.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg}: invalid JSON at line {e.lineno}: {e.msg}") from e
        return cls.from_hf_dict(d, name=path.name)


_LLAMA3_VOCAB = dict(vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001,), rms_norm_eps=1e-5)

# Random-weight shapes by name. tiny keeps CPU tests fast; the byte tokenizer needs vocab >= 258.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(name="tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=1024,
                        bos_token_id=256, eos_token_ids=(257,), tie_word_embeddings=True),
    # ~75M parameters, for CPU profiling
    "small": ModelConfig(name="small", vocab_size=32000, hidden_size=768, intermediate_size=2048,
                         num_layers=8, num_heads=12, num_kv_heads=4, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,)),
    # Llama-3.2-1B's shape
    "llama-1b": ModelConfig(name="llama-1b", hidden_size=2048, intermediate_size=8192, num_layers=16,
                            num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=131072,
                            rope_theta=500000.0, tie_word_embeddings=True,
                            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                            **_LLAMA3_VOCAB),
    # Llama-3-8B's shape
    "llama3-8b": ModelConfig(name="llama3-8b", hidden_size=4096, intermediate_size=14336, num_layers=32,
                             num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=8192,
                             rope_theta=500000.0, **_LLAMA3_VOCAB),
}


def resolve_config(model: str) -> ModelConfig:
    """A preset name, else a local model directory."""
    if model in PRESETS:
        return replace(PRESETS[model])
    return ModelConfig.from_pretrained_dir(model)
