"""Runs the model over one scheduled batch: builds the flat inputs and paged metadata, samples."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from engine.attention import AttentionMetadata, build_metadata, get_backend
from engine.core.sequence import Sequence
from engine.model import build_model, load_tokenizer, resolve_config
from engine.model.config import PRESETS
from engine.sampler import sample
from engine.threads import spinning_openmp

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: torch.dtype | str, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


class ModelRunner:
    def __init__(self, model: str, *, num_kv_blocks: int, block_size: int = 16, device: str = "cpu",
                 dtype: torch.dtype | str = "float32", attention_backend: str = "auto", seed: int = 0):
        if num_kv_blocks < 1 or block_size < 1:
            raise ValueError(f"num_kv_blocks and block_size must be >= 1, got {num_kv_blocks}, {block_size}")
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.config = resolve_config(model)
        model_dir = None if model in PRESETS else Path(model)
        self.model = build_model(self.config, model_dir, self.device, self.dtype, seed)
        self.tokenizer = load_tokenizer(model_dir, self.config.bos_token_id, self.config.eos_token_id,
                                        self.config.vocab_size)
        self.eos_token_id = self.config.eos_token_id
        self.num_kv_blocks, self.block_size = num_kv_blocks, block_size
        # a sequence can be no longer than the model's positions nor than the whole cache
        self.max_model_len = min(self.config.max_position_embeddings, num_kv_blocks * block_size)
        self.backend = get_backend(attention_backend, self.device, self.dtype)
        c = self.config
        shape = (num_kv_blocks, block_size, c.num_kv_heads, c.head_dim)
        # a slot is read only after it is written (the backends mask the rest), so the CPU pool is
        # left unfilled: its pages are touched as requests use them, not all at start-up (zeroing
        # the 80M model's default float32 pool, 6.4 GB, took 5-25 s)
        alloc = torch.empty if self.device.type == "cpu" else torch.zeros
        self.kv_caches = [(alloc(shape, dtype=self.dtype, device=self.device),
                           alloc(shape, dtype=self.dtype, device=self.device))
                          for _ in range(c.num_layers)]
        if self.device.type == "cpu" and torch.get_num_threads() > 1 and spinning_openmp():
            log.warning("OpenMP workers spin while idle (torch was imported before engine, with no "
                        "OMP_WAIT_POLICY): on a CPU shared with other processes the engine can run "
                        "several times slower; set OMP_WAIT_POLICY=PASSIVE before starting Python")
        self._seed_rng = random.Random(seed)  # seeds for requests that bring none
        self._generators: dict[str, torch.Generator] = {}

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block over every layer, K and V (what the offload tier holds per slot)."""
        from engine.kv_offload.copier import TensorCopier

        return TensorCopier.block_bytes(self.kv_caches)

    def offload_copier(self, num_slots: int):
        """A host pool of num_slots blocks and the copies between it and this runner's KV pool."""
        from engine.kv_offload.copier import TensorCopier

        return TensorCopier(self.kv_caches, num_slots)

    def _prepare(self, seqs: list[Sequence], num_new_tokens: list[int]
                 ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        if len(seqs) != len(num_new_tokens) or not seqs:
            raise ValueError(f"need one token count per sequence, got {len(seqs)} seqs and "
                             f"{len(num_new_tokens)} counts")
        ids: list[int] = []
        sampling: list[int] = []  # index of each sampling seq's last token in the flat batch
        for seq, n in zip(seqs, num_new_tokens):  # list work only: one tensor per step is made below
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            if n < 1 or end > len(seq.token_ids):
                raise ValueError(f"request {seq.request_id}: cannot compute tokens {start}..{end} "
                                 f"of {len(seq.token_ids)}")
            if end > self.max_model_len:
                raise ValueError(f"request {seq.request_id}: length {end} exceeds max_model_len "
                                 f"{self.max_model_len}")
            ids.extend(seq.token_ids[start:end])
            if end == len(seq.token_ids):
                sampling.append(len(ids) - 1)
        meta = build_metadata([s.block_table for s in seqs], [s.num_computed_tokens + n for s, n in
                                                            zip(seqs, num_new_tokens)],
                              list(num_new_tokens), self.block_size, self.device)
        return torch.tensor(ids, dtype=torch.int64, device=self.device), meta.positions, meta, sampling

    def _forward_logits(self, seqs: list[Sequence], num_new_tokens: list[int]
                        ) -> tuple[torch.Tensor, list[int]]:
        input_ids, positions, meta, sampling = self._prepare(seqs, num_new_tokens)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.backend)
        # only the last position of sampling seqs goes through lm_head (in a step of decodes alone,
        # every position: no gather)
        if len(sampling) < hidden.shape[0]:
            hidden = hidden[torch.tensor(sampling, dtype=torch.int64, device=self.device)]
        return self.model.compute_logits(hidden).float(), sampling

    @torch.inference_mode()
    def execute_logits(self, seqs: list[Sequence], num_new_tokens: list[int]) -> torch.Tensor:
        """The same pass as execute, returning float32 logits [num_sampling_seqs, vocab] instead of tokens."""
        return self._forward_logits(seqs, num_new_tokens)[0]

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new_tokens: list[int]) -> list[int | None]:
        """One forward pass; a sampled token for each seq whose chunk reaches its end, else None."""
        logits, _ = self._forward_logits(seqs, num_new_tokens)
        samples = [s.num_computed_tokens + n == len(s.token_ids) for s, n in zip(seqs, num_new_tokens)]
        samplers = [s for s, yes in zip(seqs, samples) if yes]
        params = [s.sampling_params for s in samplers]
        gens = [None if p.greedy else self._generator(s) for s, p in zip(samplers, params)]
        tokens = sample(logits, params, gens)  # one batch of tensor ops for every row
        if len(tokens) == len(seqs):
            return tokens
        it = iter(tokens)
        return [next(it) if yes else None for yes in samples]

    def _generator(self, seq: Sequence) -> torch.Generator:
        g = self._generators.get(seq.request_id)
        if g is None:
            seed = seq.sampling_params.seed
            if seed is None:
                seed = self._seed_rng.getrandbits(63)
            g = torch.Generator(device=self.device).manual_seed(seed)
            self._generators[seq.request_id] = g
        return g

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator."""
        self._generators.pop(request_id, None)
