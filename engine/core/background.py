"""Bounded background work: how much of it a step may carry, by the step's predicted time.

With --background-priority alone, background requests run only in steps with no other work, so
under steady interactive traffic they starve. Two bounds, both in predicted milliseconds of the
step (the engine's step-time model), let them in without giving interactive requests more than a
chosen slowdown:

- step_budget_ms: background work may join a step that has foreground work while the step's
  predicted time grows by at most this much. Decodes are cheap beside a small decode batch (eight
  more on a 70B model add ~1 ms to a 30 ms step); a prefill chunk costs little beside a foreground
  prefill but its fixed cost (~20 ms) rules it out of a decode step, so the bound alone decides.
- solo_step_ms: a step of background work only is filled up to this predicted time (at least one
  request always runs), so an interactive request that arrives meanwhile waits for a short step.

Background work is added after the foreground's (which is scheduled as before), running requests
first (decodes, then their prefill chunks), then waiting ones in queue order; none of it preempts,
and a request that gets no KV slots simply sits the step out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.batch_shape import BatchShape, batch_shape
from engine.core.sequence import Sequence, SequenceStatus

StepMs = Callable[[BatchShape], float]
# engine.core.scheduler's Scheduler and SchedulerOutput (not imported: the scheduler imports this module)
Scheduler = SchedulerOutput = Any


def _with(shape: BatchShape, seq: Sequence, n: int) -> BatchShape:
    """shape with seq computing n more tokens in the step (as batch_shape counts it)."""
    return BatchShape(*(a + b for a, b in zip(shape, batch_shape([seq], [n]))))


class BackgroundFill:
    def __init__(self, step_ms: StepMs, step_budget_ms: float | None, solo_step_ms: float | None):
        for name, v in (("step_budget_ms", step_budget_ms), ("solo_step_ms", solo_step_ms)):
            if v is not None and not 0 <= v < float("inf"):
                raise ValueError(f"{name} must be a non-negative number of milliseconds, got {v!r}")
        self.step_ms, self.step_budget_ms, self.solo_step_ms = step_ms, step_budget_ms, solo_step_ms

    def limit(self, shape: BatchShape, yielding: bool) -> float | None:
        """The most a step that now has `shape` may be predicted to take with background work added
        (None: no background work joins)."""
        if yielding:
            return None if self.step_budget_ms is None else self.step_ms(shape) + self.step_budget_ms
        return self.solo_step_ms

    def fill(self, sched: Scheduler, out: SchedulerOutput, budget: int, now: float, yielding: bool) -> int:
        """Adds background work to out within the step's limit; returns the token budget left."""
        shape = batch_shape(out.seqs, out.num_new_tokens)
        limit = self.limit(shape, yielding)
        if limit is None:
            return budget
        must = not yielding and not out.seqs  # a background-only step runs at least one request
        running = [s for s in sched.running if sched.is_background(s) and s not in out.seqs]
        running.sort(key=lambda s: s.num_remaining_tokens != 1)  # decodes first
        for seq in running:
            if budget == 0:
                return 0
            n = self._fit(seq, min(seq.num_remaining_tokens, budget), shape, limit, must, sched)
            if n and sched.bm.append_slots(seq, n):
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                shape, budget, must = _with(shape, seq, n), budget - n, False
        for seq in [s for s in sched.waiting if sched.is_background(s)]:
            if budget == 0 or len(sched.running) >= sched.max_num_seqs:
                break
            hit_blocks, hit_hashes = sched.bm.lookup_prefix(seq)
            need = len(seq) - len(hit_blocks) * sched.bm.block_size
            if need > budget and not sched.enable_chunked_prefill:
                continue
            probe = _Probe(seq, len(hit_blocks) * sched.bm.block_size)
            n = self._fit(probe, min(need, budget), shape, limit, must, sched)
            if not n or not sched.bm.can_admit(seq, hit_blocks, n):
                break  # the queue's order holds: nothing later jumps this one
            sched.waiting.remove(seq)
            sched.bm.admit(seq, hit_blocks, hit_hashes)
            sched.bm.append_slots(seq, n)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            sched.running.append(seq)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            shape, budget, must = _with(shape, seq, n), budget - n, False
        return budget

    def _fit(self, seq, n: int, shape: BatchShape, limit: float, must: bool, sched: Scheduler) -> int:
        """The most of seq's n tokens the step can take within limit (0: none). A prefill may be cut
        to a shorter chunk when chunked prefill is on."""
        if must or self.step_ms(_with(shape, seq, n)) <= limit:
            return n
        if n == 1 or not sched.enable_chunked_prefill:
            return 0
        lo, hi = 0, n  # fits(lo), not fits(hi): the step time grows with the chunk
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.step_ms(_with(shape, seq, mid)) <= limit:
                lo = mid
            else:
                hi = mid
        return lo


class _Probe:
    """A waiting request as batch_shape sees it once its cached prefix is counted as computed."""

    def __init__(self, seq: Sequence, cached: int):
        self.num_computed_tokens = cached
        self.num_prompt_tokens = seq.num_prompt_tokens
