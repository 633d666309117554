"""Build a LlamaForCausalLM on a device: weights from local safetensors, or random from a seed."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.model.bf16 import pack_linears, packing_available, set_upcast, upcast_wanted
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


def checkpoint_files(path: str | Path) -> dict[str, Path]:
    """tensor name -> file holding it, from a single model.safetensors or a sharded index."""
    path = Path(path)
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: not a safetensors index (needs a 'weight_map' object): {e}") from e
        files = {name: path / shard for name, shard in weight_map.items()}
        for shard in set(files.values()):
            if not shard.is_file():
                raise ValueError(f"{index}: shard {shard.name} listed in weight_map is missing")
        return files
    single = path / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}
    raise ValueError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints are supported)")


def _empty_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    # Build on the meta device so no memory is spent on throw-away default initialisation.
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty materialises each module's parameters separately
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def load_weights(model: LlamaForCausalLM, path: str | Path) -> None:
    from safetensors import safe_open

    params = model.checkpoint_parameters()  # q/k/v and gate/up: row slices of the fused parameters
    files = checkpoint_files(path)
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    loaded: set[str] = set()
    device = next(model.parameters()).device
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in names:
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue  # tied: the embedding is the head
                if name not in params:
                    raise ValueError(f"{file.name}: unexpected tensor {name!r} for a Llama model")
                t = f.get_tensor(name)
                if t.shape != params[name].shape:
                    raise ValueError(f"{file.name}: tensor {name!r} has shape {tuple(t.shape)}, "
                                     f"expected {tuple(params[name].shape)}")
                with torch.no_grad():
                    params[name].copy_(t)
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{path}: checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:3])}")


def init_random(model: LlamaForCausalLM, seed: int) -> None:
    """Normal(0, 0.02) matrices, unit norms, zero biases, from a seeded generator on the model's device."""
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.checkpoint_parameters().items():  # transformers' order and shapes
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)


def build_model(cfg: ModelConfig, path: str | Path | None, device: torch.device | str, dtype: torch.dtype,
                seed: int = 0, bf16_matmul: str = "auto") -> LlamaForCausalLM:
    """Weights from the safetensors under path, or random ones from seed when path is None.

    bf16_matmul: "auto" computes a bf16 model's matmuls in float32 on a CPU without native bf16
    (see engine/model/bf16.py); "native" or "upcast" force one way."""
    device = torch.device(device)
    upcast = upcast_wanted(bf16_matmul, dtype, device)
    model = _empty_model(cfg, device, dtype)
    if path is None:
        init_random(model, seed)
    else:
        load_weights(model, path)
    model.init_rope(device)
    set_upcast(model, upcast)
    if not upcast and packing_available(dtype, device):
        pack_linears(model)
    return model.eval()
