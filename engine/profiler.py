"""Times whole engine steps (ModelRunner.execute: forward with paged attention, sampling) over a grid.

Each step is built directly: Sequences whose first tokens are already "computed" (their K/V slots are
in the cache) and block tables drawn from a shuffled pool, so any mix of prefill chunks, cached context
and decodes can be measured without running requests to that state. One CSV row per step shape, with
the profile columns of DESIGN.md plus the step's split (prefill_tokens, prefill_context, prefill_seqs,
decode_seqs, decode_context, cached_tokens) that the simulator's latency fit reads.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from engine.core.batch_shape import BatchShape
from engine.core.profile_csv import PROFILE_COLUMNS
from engine.core.sequence import Sequence

CSV_COLUMNS = [*PROFILE_COLUMNS, "prefill_tokens", "prefill_context", "prefill_seqs", "cached_tokens",
               "decode_seqs", "decode_context", "repeats", "latency_min_ms", "latency_max_ms"]


@dataclass(frozen=True)
class StepShape:
    """One engine step: an optional prefill chunk on top of cached tokens, plus decodes."""

    prefill_tokens: int = 0  # chunk length (0: no prefill in the step)
    cached_tokens: int = 0  # KV already in the cache before the chunk
    decode_seqs: int = 0
    decode_len: int = 0  # KV length of each decode after the step

    @property
    def phase(self) -> str:
        if self.prefill_tokens and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"

    @property
    def batch_size(self) -> int:
        return self.decode_seqs + (1 if self.prefill_tokens else 0)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def prefill_context(self) -> int:
        return self.cached_tokens + self.prefill_tokens if self.prefill_tokens else 0

    @property
    def context_tokens(self) -> int:
        return self.prefill_context + self.decode_seqs * self.decode_len

    @property
    def longest(self) -> int:
        return max(self.prefill_context, self.decode_len)


@dataclass
class Grid:
    prefill_chunks: list[int]
    cached_contexts: list[int]  # for prefill steps (0 = a fresh prompt)
    decode_batches: list[int]
    decode_contexts: list[int]
    mixed_chunks: list[int]  # prefill chunk of a mixed step, on top of the decodes below
    mixed_batches: list[int]
    mixed_context: int

    def shapes(self, max_model_len: int) -> list[StepShape]:
        out = [StepShape(prefill_tokens=p, cached_tokens=c)
               for c in self.cached_contexts for p in self.prefill_chunks]
        out += [StepShape(decode_seqs=b, decode_len=n)
                for n in self.decode_contexts for b in self.decode_batches]
        out += [StepShape(prefill_tokens=p, cached_tokens=self.mixed_context, decode_seqs=b,
                          decode_len=self.mixed_context)
                for b in self.mixed_batches for p in self.mixed_chunks]
        return [s for s in out if s.longest <= max_model_len]


def powers_of_two(lo: int, hi: int) -> list[int]:
    """lo, 2*lo, ... up to hi, with hi itself included."""
    out, x = [], lo
    while x < hi:
        out.append(x)
        x *= 2
    return out + [hi]


def default_grid(max_num_seqs: int, quick: bool, max_model_len: int = 8192) -> Grid:
    """The quick grid, or the full one with contexts scaled down for models of few positions."""
    if quick:
        return Grid(prefill_chunks=[16, 64, 256], cached_contexts=[0, 256],
                    decode_batches=powers_of_two(1, min(max_num_seqs, 16)), decode_contexts=[64, 512],
                    mixed_chunks=[16, 128], mixed_batches=[2, 8], mixed_context=256)
    mid, long = min(1024, max_model_len // 4), min(4096, max_model_len // 2)
    return Grid(prefill_chunks=powers_of_two(16, 8192), cached_contexts=sorted({0, mid, long}),
                decode_batches=powers_of_two(1, max_num_seqs), decode_contexts=sorted({128, mid, long}),
                mixed_chunks=[64, 256, 1024],
                mixed_batches=sorted({1, 8, min(32, max_num_seqs), max_num_seqs}),
                mixed_context=mid)


def tokens_needed(shape: StepShape) -> int:
    return shape.prefill_context + shape.decode_seqs * shape.decode_len


def build_step(shape: StepShape, blocks: list[int], block_size: int, vocab_size: int, rng: random.Random
               ) -> tuple[list[Sequence], list[int]]:
    """Sequences in the state just before the step, with block tables taken in order from `blocks`."""
    lens = ([(shape.prefill_context, shape.prefill_tokens)] if shape.prefill_tokens else [])
    lens += [(shape.decode_len, 1)] * shape.decode_seqs
    seqs, news, used = [], [], 0
    for total, new in lens:
        seq = Sequence([rng.randrange(vocab_size) for _ in range(total)])
        n_blocks = -(-total // block_size)
        seq.block_table = blocks[used:used + n_blocks]
        used += n_blocks
        seq.num_computed_tokens = total - new
        seqs.append(seq)
        news.append(new)
    if used > len(blocks):
        raise ValueError(f"step {shape} needs {used} KV blocks, the cache has {len(blocks)}")
    return seqs, news


def time_step(runner, seqs: list[Sequence], news: list[int], repeats: int, warmup: int,
              clock: str = "wall") -> list[float]:
    """Milliseconds of runner.execute per repeat (CUDA events on GPU, wall clock on CPU).

    clock "cpu" (CPU, one torch thread) times the calling thread's CPU time instead: what the step
    costs, without the time other processes on a shared machine hold the core (on a quiet machine
    the two agree)."""
    import torch

    cuda = runner.device.type == "cuda"
    now = time.thread_time if clock == "cpu" and not cuda else time.perf_counter
    for _ in range(warmup):
        runner.execute(seqs, news)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.execute(seqs, news)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = now()
            runner.execute(seqs, news)
            times.append((now() - t0) * 1e3)
    for seq in seqs:
        runner.release(seq.request_id)
    return times


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def weight_bytes(config, dtype_bytes: int) -> int:
    """Llama parameter count from the shapes, times the element size."""
    c = config
    attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return dtype_bytes * (c.num_layers * (attn + mlp + 2 * c.hidden_size) + embed + c.hidden_size)


def kv_blocks(shape: StepShape, block_size: int) -> int:
    """Blocks the step's sequences hold: each sequence rounds up to whole blocks."""
    lens = ([shape.prefill_context] if shape.prefill_tokens else []) + [shape.decode_len] * shape.decode_seqs
    return sum(-(-n // block_size) for n in lens)


def fit_memory(shapes: list[StepShape], block_size: int, max_blocks: int) -> tuple[list[StepShape], list]:
    """The shapes whose KV fits in max_blocks blocks, and the ones left out."""
    keep = [s for s in shapes if kv_blocks(s, block_size) <= max_blocks]
    return keep, [s for s in shapes if kv_blocks(s, block_size) > max_blocks]


def zero_kv(runner) -> None:
    """Zero the runner's KV pool. Profiled steps attend over context that was never written, and the
    CPU pool starts unfilled: unzeroed, a step reads whatever the pages held (NaN logits included)."""
    for key_cache, value_cache in runner.kv_caches:
        key_cache.zero_()
        value_cache.zero_()


def profile_rows(runner, shapes: list[StepShape], *, device_name: str, model_name: str, dtype: str,
                 repeats: int, warmup: int = 1, seed: int = 0, on_row=None, clock: str = "wall"
                 ) -> list[dict]:
    """Measure every shape on runner; on_row(row) is called as each is measured."""
    rng = random.Random(seed)
    pool = list(range(runner.num_kv_blocks))
    rng.shuffle(pool)  # non-adjacent blocks, as a long-running engine has them
    zero_kv(runner)
    rows = []
    for shape in shapes:
        seqs, news = build_step(shape, pool, runner.block_size, runner.config.vocab_size, rng)
        times = time_step(runner, seqs, news, repeats, warmup, clock)
        batch = BatchShape(shape.prefill_tokens, shape.prefill_context, 1 if shape.prefill_tokens else 0,
                           shape.cached_tokens, shape.decode_seqs, shape.decode_seqs * shape.decode_len)
        rows.append(step_row(batch, times, device_name=device_name, model_name=model_name, dtype=dtype))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def step_row(shape: BatchShape, times_ms: list[float], *, device_name: str, model_name: str,
             dtype: str) -> dict:
    """One profile CSV row: the step's shape and the median of its timings."""
    return {
        "device": device_name, "model": model_name, "dtype": dtype, "tp": 1, "phase": shape.phase,
        "batch_size": shape.prefill_seqs + shape.decode_seqs,
        "num_tokens": shape.prefill_tokens + shape.decode_seqs,
        "context_tokens": shape.prefill_context + shape.decode_context,
        "latency_ms": round(statistics.median(times_ms), 4),
        "prefill_tokens": shape.prefill_tokens, "prefill_context": shape.prefill_context,
        "prefill_seqs": shape.prefill_seqs, "cached_tokens": shape.cached_tokens,
        "decode_seqs": shape.decode_seqs, "decode_context": shape.decode_context,
        "repeats": len(times_ms), "latency_min_ms": round(min(times_ms), 4),
        "latency_max_ms": round(max(times_ms), 4),
    }
