"""Shared by the engine parity tests: a random-weight transformers Llama saved to disk."""

from __future__ import annotations

import random
from pathlib import Path

import torch

HF_CONFIG = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                 rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=False, initializer_range=0.3)


def save_random_llama(path: Path, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**HF_CONFIG, **overrides})).eval()
    model.save_pretrained(path)
    return path


def mixed_prompts(n: int = 8, seed: int = 0, vocab: int = 384, lengths=(1, 7, 16, 33, 64, 129, 250, 300)):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def hf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for p in prompts:  # one at a time: no padding to disturb the reference
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
            outs.append(gen[0, len(p):].tolist())
    return outs
