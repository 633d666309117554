"""Random-weight Llama models for the engine benchmarks, written once as transformers checkpoints.

Three sizes: the tiny preset's shape (3.7M parameters), ~80M and ~400M. Each is written under
build/bench-models/<name> (float32 safetensors, seeded) the first time it is asked for, so ours,
vLLM and transformers all load the same directory.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "bench-models"

COMMON = dict(vocab_size=2048, max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1,
              eos_token_id=2, initializer_range=0.05)
SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2),
    "80m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                num_key_value_heads=4),
    "400m": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=8),
}


def hf_config(size: str) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid: {', '.join(SIZES)}")
    return {**COMMON, **SIZES[size]}


def model_dir(size: str, seed: int = 0, root: Path = CACHE) -> Path:
    """The checkpoint directory of a size, written (random weights from seed) when absent."""
    cfg = hf_config(size)
    path = root / f"llama-{size}-seed{seed}"
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(path)  # a half-written directory is never taken for a model
    return path


def num_parameters(size: str) -> int:
    c = hf_config(size)
    h, i, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    d = h // c["num_attention_heads"]
    attn = h * h * 2 + 2 * h * c["num_key_value_heads"] * d
    return n * (attn + 3 * h * i + 2 * h) + 2 * v * h + h


if __name__ == "__main__":
    import sys

    for s in sys.argv[1:] or list(SIZES):
        print(s, f"{num_parameters(s) / 1e6:.1f}M parameters", model_dir(s))
