"""Llama-family model: config and presets, RoPE, the module, weight loading, tokenizers.

Config and tokenizers import without torch (the emulated server uses them); the module and the
loader are imported on first use.
"""

from engine.model.config import PRESETS, ModelConfig, resolve_config
from engine.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = ["PRESETS", "ByteTokenizer", "HFTokenizer", "LlamaForCausalLM", "ModelConfig", "build_model",
           "load_tokenizer", "resolve_config"]


def __getattr__(name: str):
    if name == "LlamaForCausalLM":
        from engine.model.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if name == "build_model":
        from engine.model.loader import build_model

        return build_model
    raise AttributeError(f"module 'engine.model' has no attribute {name!r}")
