"""Continuous batching on two deques, in the way vLLM schedules.

Each step, running requests go first (a decode takes one token, an unfinished prefill the rest
of its chunk), then waiting requests fill what is left of the token budget; a prefill that does
not fit is chunked. With chunked prefill off, a prompt is computed whole in one step: a waiting
request whose prefill does not fit what is left of the budget is passed over for this step and
the next one that fits goes ahead (vLLM's V1 scheduler does the same). When blocks run out, the
newest running request (or the lowest-priority one) is preempted: its blocks are freed and it is
recomputed later, possibly from the prefix cache.

Background requests (priority >= background_priority, when set) yield whole steps: while any other
request runs or waits, a step carries none of them; they keep their blocks and resume in the next
step with no foreground work, and a foreground request short of a seat or of blocks preempts them
first. Any batch token shares, and so lengthens, the steps of every request in it (a prefill chunk
of any size adds ~20 ms to a 30 ms decode step of a 70B model), so priority only in the queue order
and the preemption choice does not keep batch work off interactive latency. With a step-time
model, engine.core.background lets a bounded amount of it into those steps (and caps the steps of
background work alone).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.background import BackgroundFill
from engine.core.block_manager import BlockManager, cdiv
from engine.core.sequence import Sequence, SequenceStatus


class RequestRejected(ValueError):
    """A request that can never be served (too long for the model or for the whole KV pool)."""


@dataclass
class SchedulerOutput:
    """One step's batch; its shape (prefill/decode split) is engine.core.batch_shape of it."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


def length_left(seq: Sequence, max_model_len: int) -> int:
    """Tokens seq may still generate before it stops for length (max_tokens or max_model_len)."""
    left = seq.sampling_params.max_tokens - seq.num_output_tokens
    room = max_model_len - len(seq)
    return room if room < left else left


def whole_prefill_error(max_num_batched_tokens: int, max_model_len: int) -> str | None:
    """Why a scheduler without chunked prefill could not run (None: it can). Every prompt, and every
    preempted request recomputed, must fit one step's token budget."""
    if max_num_batched_tokens < max_model_len:
        return (f"without chunked prefill a whole prompt is computed in one step, so max_num_batched_tokens "
                f"({max_num_batched_tokens}) must be at least max_model_len ({max_model_len})")
    return None


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                 eos_token_id: int | list[int] | None = None, policy: str = "fcfs",
                 enable_chunked_prefill: bool = True, background_priority: int | None = None,
                 background_fill: BackgroundFill | None = None):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {policy!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.bm = block_manager
        pool_tokens = block_manager.num_blocks * block_manager.block_size
        # a lone request must always fit, or it could never finish
        self.max_model_len = min(max_model_len or pool_tokens, pool_tokens)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        if not enable_chunked_prefill:
            error = whole_prefill_error(max_num_batched_tokens, self.max_model_len)
            if error:
                raise ValueError(error)
        # Llama-3 checkpoints end turns with several ids
        self.eos_token_ids = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [])
        self.policy = policy
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.background_priority = background_priority
        self.num_foreground = 0  # unfinished requests that are not background
        if background_fill is not None and background_priority is None:
            raise ValueError("a background step budget needs a background priority (--background-priority)")
        self.background_fill = background_fill

    def is_background(self, seq: Sequence) -> bool:
        return self.background_priority is not None and seq.priority >= self.background_priority

    def _yielding(self) -> bool:
        """Background requests sit this step out: some other request runs or waits."""
        return self.background_priority is not None and self.num_foreground > 0

    # -- admission ---------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        n = len(seq)
        if n == 0:
            raise RequestRejected("the prompt is empty")
        pool = self.bm.num_blocks * self.bm.block_size
        if n >= self.max_model_len:
            where = (f"the KV cache holds {pool} tokens" if self.max_model_len == pool
                     else f"max_model_len is {self.max_model_len}")
            raise RequestRejected(f"prompt has {n} tokens but {where}; prompt plus at least one "
                                  f"generated token must fit")
        seq.status = SequenceStatus.WAITING
        if not self.is_background(seq):
            self.num_foreground += 1
        if self.policy == "priority":
            self._insert_by_priority(seq)
        else:
            self.waiting.append(seq)

    def _insert_by_priority(self, seq: Sequence) -> None:
        key = (seq.priority, seq.arrival_time)
        for i, other in enumerate(self.waiting):
            if key < (other.priority, other.arrival_time):
                self.waiting.insert(i, seq)
                return
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        yielding = self._yielding()
        fill = self.background_fill
        if fill is not None and not yielding and fill.solo_step_ms is not None:
            budget = fill.fill(self, out, budget, now, yielding)  # background only: a short step
            if out.seqs:
                return out
            budget = self.max_num_batched_tokens  # no room for any: as without the cap (may preempt)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this step
                continue
            if yielding and self.is_background(seq):  # paused: keeps its blocks
                continue
            n = min(seq.num_remaining_tokens, budget)
            while not self.bm.append_slots(seq, n):
                victim = self._pick_victim()
                budget += self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                budget -= n
        if not out.preempted:
            budget = self._admit_waiting(out, budget, now, yielding)
            if fill is not None and yielding:
                fill.fill(self, out, budget, now, yielding)
        return out

    def first_fit(self, budget: int, yielding: bool = False) -> tuple[int, list[int], list[int], int] | None:
        """The waiting request a step with `budget` tokens left would start next: its index in the
        queue, its cached prefix (blocks, hashes) and the tokens it would compute. None: none fits.
        Pure. With chunked prefill on it is the head of the queue (yielding: the first foreground one)."""
        for i, seq in enumerate(self.waiting):
            if yielding and self.is_background(seq):
                continue
            hit_blocks, hit_hashes = self.bm.lookup_prefix(seq)
            need = len(seq) - len(hit_blocks) * self.bm.block_size
            if need <= budget or self.enable_chunked_prefill:
                return i, hit_blocks, hit_hashes, min(need, budget)
        return None

    def _admit_waiting(self, out: SchedulerOutput, budget: int, now: float, yielding: bool = False) -> int:
        while self.waiting and budget > 0:
            full = len(self.running) >= self.max_num_seqs
            if full and not yielding:
                break
            fit = self.first_fit(budget, yielding)
            if fit is None:
                break
            i, hit_blocks, hit_hashes, n = fit
            seq = self.waiting[i]
            if full or not self.bm.can_admit(seq, hit_blocks, n):
                if yielding and self._preempt_background(out):
                    continue  # a seat or blocks freed: look again (the prefix hit may have changed)
                break
            del self.waiting[i]
            self.bm.admit(seq, hit_blocks, hit_hashes)
            self.bm.append_slots(seq, n)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            self.running.append(seq)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
        return budget

    def _preempt_background(self, out: SchedulerOutput) -> bool:
        """Frees the seat and blocks of a paused background request for a foreground one."""
        paused = [s for s in self.running if self.is_background(s)]
        if not paused:
            return False
        self._preempt(max(paused, key=lambda s: (s.priority, s.arrival_time)), out)
        return True

    def _pick_victim(self) -> Sequence:
        if self.policy == "priority":
            return max(self.running, key=lambda s: (s.priority, s.arrival_time))
        return self.running[-1]

    def _preempt(self, victim: Sequence, out: SchedulerOutput) -> int:
        """Frees victim for later recompute; returns budget it had been given this step."""
        returned = 0
        if victim in out.seqs:
            i = out.seqs.index(victim)
            returned = out.num_new_tokens[i]
            del out.seqs[i], out.num_new_tokens[i]
        self.running.remove(victim)
        self.bm.free(victim)
        victim.status = SequenceStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if self.policy == "priority":  # back in its priority's place, as vLLM's priority queue does
            self._insert_by_priority(victim)
        else:
            self.waiting.appendleft(victim)
        out.preempted.append(victim)
        return returned

    # -- after the step ----------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list[int | None], now: float = 0.0) -> list[Sequence]:
        finished = []
        for seq, n, token in zip(out.seqs, out.num_new_tokens, sampled):
            if seq.status != SequenceStatus.RUNNING:  # aborted while the step ran
                continue
            seq.num_computed_tokens += n
            self.bm.cache_full_blocks(seq)
            if token is None:
                continue
            seq.append_token(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self._stop_reason(seq, token)
            if reason:
                self._finish(seq, reason, now)
                finished.append(seq)
        return finished

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling_params
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if length_left(seq, self.max_model_len) <= 0:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.bm.free(seq)
        if not self.is_background(seq):
            self.num_foreground -= 1
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now

    def finish(self, seq: Sequence, reason: str, now: float = 0.0) -> None:
        """Ends seq early for a reason found by the caller (e.g. a stop string)."""
        if seq.status != SequenceStatus.FINISHED:
            self._finish(seq, reason, now)

    def abort(self, request_id: str, now: float = 0.0) -> bool:
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.request_id == request_id:
                    self._finish(seq, "abort", now)
                    return True
        return False

    def blocks_needed(self, seq: Sequence) -> int:
        return cdiv(len(seq), self.bm.block_size)
