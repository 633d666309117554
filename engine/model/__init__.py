"""Llama-family model: config and presets, RoPE, the module, weight loading, tokenizers."""

from engine.model.config import PRESETS, ModelConfig, resolve_config
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import build_model
from engine.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = ["PRESETS", "ByteTokenizer", "HFTokenizer", "LlamaForCausalLM", "ModelConfig", "build_model",
           "load_tokenizer", "resolve_config"]
