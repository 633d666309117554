"""Write a random-weight Llama model directory that `vllm serve DIR` loads, offline.

The weights come from transformers' LlamaForCausalLM with a fixed seed; the tokenizer is a small
byte-level BPE trained here with `tokenizers` on the docstrings of Python's builtins (no download).
Every token a client can be streamed decodes to non-empty text, so streamed chunks count tokens: the
vocabulary is ASCII only (no token holds half of a UTF-8 character) and the special tokens' embedding
rows are zero, so with tied embeddings their logit is 0 and greedy decoding never picks them.
Run with any Python that has torch, transformers and tokenizers (the vLLM environment has all three):

    .venv-vllm/bin/python scripts/make_random_llama.py build/random-llama
"""

from __future__ import annotations

import argparse
import builtins
import json
from pathlib import Path

# ~3.6M parameters: large enough for vLLM's CPU kernels (head_dim 64), small enough to start fast
CONFIG = dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=0,
              eos_token_id=1, pad_token_id=None, torch_dtype="float32")
SPECIALS = ["<s>", "</s>"]


def corpus() -> list[str]:
    """Text on every machine with Python: the builtins' docstrings, in a stable order."""
    docs = [getattr(builtins, name).__doc__ or "" for name in sorted(dir(builtins))]
    return [d.encode("ascii", "ignore").decode() for d in docs if d.strip()]


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_model(out: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(CONFIG["vocab_size"])
    tok.save(str(out / "tokenizer.json"))
    # the config's vocabulary covers the tokenizer's, whatever size training reached
    assert tok.get_vocab_size() <= CONFIG["vocab_size"], tok.get_vocab_size()
    assert [tok.token_to_id(s) for s in SPECIALS] == [CONFIG["bos_token_id"], CONFIG["eos_token_id"]]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "model_max_length": CONFIG["max_position_embeddings"], "add_bos_token": False,
        "clean_up_tokenization_spaces": False}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}, indent=2))

    torch.manual_seed(seed)
    cfg = {k: v for k, v in CONFIG.items() if k != "torch_dtype"}
    model = LlamaForCausalLM(LlamaConfig(architectures=["LlamaForCausalLM"], **cfg)).to(torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[[CONFIG["bos_token_id"], CONFIG["eos_token_id"]]] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": CONFIG["bos_token_id"], "eos_token_id": CONFIG["eos_token_id"]}, indent=2))
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: random Llama, {n / 1e6:.1f}M parameters, vocabulary {tok.get_vocab_size()}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="model directory to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write_model(args.out, args.seed)


if __name__ == "__main__":
    main()
