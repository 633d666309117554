"""Advancing k identical decode steps at once, on top of the engine core's objects.

After a decode-only step in which every running request was scheduled, the following steps are
identical (same sequences, one token each) until a sequence finishes, a block allocation fails or
a request arrives. These helpers find how many such steps are safe and apply them with exactly the
block-manager calls the scheduler would have made, in the same order (allocations of step j, then
the full blocks step j registers in the prefix cache), so later steps see the same KV state.
"""

from __future__ import annotations

from engine.core.block_manager import BlockManager, cdiv
from engine.core.scheduler import Scheduler, length_left
from engine.core.sequence import Sequence


def _blocks_needed(seqs, bs: int, j: int) -> int:
    """New blocks that j more decode steps need beyond what the block tables hold."""
    return sum(max(0, cdiv(s.num_computed_tokens + j, bs) - len(s.block_table)) for s in seqs)


def decode_stretch(sched: Scheduler) -> tuple[int, bool]:
    """How many of the next steps are identical decodes of the whole running batch (0: take a real
    step), and whether the last of them finishes some requests.

    True when every running request has only its last sampled token to compute, no waiting request
    can be admitted (the batch is full, or the next request to start does not fit now, and free blocks only
    shrink while decoding), up to the first step that finishes a request (max_tokens, max_model_len),
    and as long as every block allocation succeeds. With a prefix cache, a waiting request whose
    cached blocks sit in the free queue may fit once an allocation evicts them: the stretch then ends
    before the next step that allocates.
    """
    running = sched.running
    if not running or len(running) > sched.max_num_batched_tokens:
        return 0, False
    if sched.background_priority is not None:  # paused background requests: not every one runs
        return 0, False
    limit = max_len = sched.max_model_len
    for s in running:
        if len(s.token_ids) - s.num_computed_tokens != 1 or s.num_computed_tokens < s.num_prompt_tokens:
            return 0, False  # a prefill (chunk) is pending, a last prompt token included
        left = length_left(s, max_len)
        if left < limit:
            limit = left
    if limit <= 0:
        return 0, False
    bm = sched.bm
    bs = bm.block_size
    finish_at = limit  # the step that finishes a request
    if sched.waiting and len(running) < sched.max_num_seqs:
        budget = sched.max_num_batched_tokens - len(running)
        if budget > 0:
            fit = sched.first_fit(budget)
            if fit is not None and bm.can_admit(sched.waiting[fit[0]], fit[1], fit[3]):
                return 0, False
            if (fit is not None and bm.enable_prefix_caching
                    and any(b >= 0 and bm.allocator.is_free(b) for b in fit[1])):  # <0: offload tier
                # an allocation may evict the waiting request's cached free blocks, which then no
                # longer count against the free ones it needs: it may fit at the next step that
                # allocates; stop before that step (steps that allocate nothing change nothing)
                limit = min(limit, min(len(s.block_table) * bs - s.num_computed_tokens for s in running))
                if limit <= 0:
                    return 0, False
    free = bm.num_free_blocks
    if _blocks_needed(running, bs, limit) <= free:
        return limit, limit == finish_at
    lo, hi = 0, limit  # need(lo) <= free < need(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _blocks_needed(running, bs, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo, False


def advance_decodes(bm: BlockManager, seqs: list[Sequence], k: int, token: int) -> None:
    """Applies k decode steps to seqs (each with only its last sampled token left to compute), as the
    scheduler would: each step allocates the blocks the sequences grow into (in batch order),
    computes one token per sequence, registers newly full blocks and appends the sampled token."""
    bs = bm.block_size
    if not bm.enable_prefix_caching:
        # without a prefix cache a block's identity is never observed: grow each table at once
        for s in seqs:
            s.token_ids.extend([token] * k)
            if cdiv(s.num_computed_tokens + k, bs) > len(s.block_table) and not bm.append_slots(s, k):
                raise RuntimeError("fast path: a block allocation failed that decode_stretch allowed")
            s.num_computed_tokens += k
        return
    base = [s.num_computed_tokens for s in seqs]
    events = []  # (step, phase, order): phase 0 = allocate before the step, 1 = cache after it
    for i, (s, c) in enumerate(zip(seqs, base)):
        s.token_ids.extend([token] * k)
        # step j (1..k) computes token c + j - 1 (0-based); it needs a block when that index starts one
        first_alloc = len(s.block_table) * bs - c + 1
        for j in range(max(first_alloc, 1), k + 1, bs):
            events.append((j, 0, i))
        if bm.enable_prefix_caching:
            # after step j, c + j tokens are computed: a block fills when that is a multiple of bs
            first_full = bs - c % bs if c % bs else bs
            for j in range(first_full, k + 1, bs):
                events.append((j, 1, i))
    events.sort()
    for j, phase, i in events:
        s = seqs[i]
        if phase == 0:
            s.num_computed_tokens = base[i] + j - 1
            if not bm.append_slots(s, 1):
                raise RuntimeError("fast path: a block allocation failed that max_identical_steps allowed")
        else:
            s.num_computed_tokens = base[i] + j
            bm.cache_full_blocks(s)
    for s, c in zip(seqs, base):
        s.num_computed_tokens = c + k
