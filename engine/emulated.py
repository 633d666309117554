"""A model runner with no weights: each step sleeps for what a calibrated latency model predicts.

The real scheduler and KV block manager run unchanged (LLMEngine(runner=EmulatedRunner(...))), so
queueing, chunked prefill, preemption and prefix caching behave as in the real engine; only the
forward pass is replaced by a sleep, and the sampled tokens by filler text. No torch is imported,
so a laptop can host a fleet of emulated "H100 replicas".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from engine.core.batch_shape import batch_shape
from engine.core.sequence import Sequence
from engine.kv_offload import DEFAULT_BANDWIDTH_GBS, TimedCopier
from engine.model.tokenizer import ByteTokenizer

FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt "
BOS, EOS, VOCAB = 256, 257, 512  # the byte tokenizer's ids, as in the tiny preset
DEFAULT_MAX_MODEL_LEN = 4096  # no weights, so no position limit: this stands in for one


class StepTimeModel(Protocol):
    def step_ms(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_context: int,
                prefill_seqs: int) -> float: ...


class EmulatedRunner:
    """ModelRunner's interface (execute, release, tokenizer, max_model_len, ...), timed by a model.

    latency: the step-time model, loaded by the caller (the `serve --emulate` command loads a
    calibrated one). sleep/clock are injectable so a replay can run in virtual time. Back-to-back
    steps are timed from the previous step's deadline, not from when the thread got round to the
    next one: Python work and late wake-ups on a busy machine are taken out of the next sleep, so a
    busy engine keeps the model's pace. The server calls idle() when
    the engine runs out of work, so the next step starts from its own start time; a lag of more
    than max_lag_s (a stalled machine) is not caught up either.
    """

    def __init__(self, latency: StepTimeModel, *, num_kv_blocks: int, block_size: int = 16,
                 max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.perf_counter,
                 max_lag_s: float = 0.25, kv_bytes_per_token: float | None = None,
                 offload_bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS):
        if num_kv_blocks < 1 or block_size < 1 or max_model_len < 2:
            raise ValueError(f"need num_kv_blocks >= 1, block_size >= 1, max_model_len >= 2; got "
                             f"{num_kv_blocks}, {block_size}, {max_model_len}")
        self.latency = latency
        self.num_kv_blocks, self.block_size = num_kv_blocks, block_size
        self.max_model_len = min(max_model_len, num_kv_blocks * block_size)
        self.tokenizer = ByteTokenizer(BOS, EOS, VOCAB)
        self.eos_token_ids = [EOS]
        self._filler = [self.tokenizer.offset + b for b in FILLER.encode()]
        self._sleep, self._clock, self.max_lag_s = sleep, clock, max_lag_s
        self._deadline: float | None = None
        self.steps: list[tuple[tuple[int, ...], float]] = []  # (shape, predicted ms) when log_steps
        self.log_steps = False
        # the offload tier, if any, has no data here: its loads cost bytes / bandwidth of step time
        self.kv_block_bytes = int(kv_bytes_per_token * block_size) if kv_bytes_per_token else None
        self.offload_bandwidth_gbs = offload_bandwidth_gbs
        self._copier: TimedCopier | None = None

    def offload_copier(self, num_slots: int) -> TimedCopier:
        self._copier = TimedCopier(self.offload_bandwidth_gbs, self.kv_block_bytes)
        return self._copier

    def execute(self, seqs: list[Sequence], num_new_tokens: list[int]) -> list[int | None]:
        now = self._clock()
        b = batch_shape(seqs, num_new_tokens)
        shape = (b.prefill_tokens, b.prefill_context, b.decode_seqs, b.decode_context, b.prefill_seqs)
        ms = self.latency.step_ms(*shape)
        if self._copier is not None:  # blocks loaded from the offload tier while scheduling this step
            ms += self._copier.take_pending() * 1000.0
        if self.log_steps:
            self.steps.append((shape, ms))
        start = now
        if self._deadline is not None and now - self._deadline < self.max_lag_s:
            start = self._deadline
        self._deadline = start + ms / 1000.0
        wait = self._deadline - self._clock()
        if wait > 0:
            self._sleep(wait)
        return [self._filler[(s.num_output_tokens) % len(self._filler)]
                if s.num_computed_tokens + n == len(s.token_ids) else None
                for s, n in zip(seqs, num_new_tokens)]

    def release(self, request_id: str) -> None:
        pass

    def idle(self) -> None:
        """No work left: the next step starts whenever it is called, not at the last deadline."""
        self._deadline = None


class VirtualClock:
    """Time that only moves when a step 'sleeps': replays a load as the latency model predicts it."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
