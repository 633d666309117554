"""Advancing k identical decode steps at once, on top of the engine core's objects.

After a decode-only step in which every running request was scheduled, the following steps are
identical (same sequences, one token each) until a sequence finishes, a block allocation fails or
a request arrives. These helpers find how many such steps are safe and apply them with exactly the
block-manager calls the scheduler would have made, in the same order (allocations of step j, then
the full blocks step j registers in the prefix cache), so later steps see the same KV state.
"""

from __future__ import annotations

from engine.core.block_manager import BlockManager, cdiv
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence


def _blocks_needed(seqs: list[Sequence], bs: int, j: int) -> int:
    """New blocks that j more decode steps need beyond what the block tables hold."""
    return sum(cdiv(s.num_computed_tokens + 1 + j, bs) - cdiv(s.num_computed_tokens + 1, bs) for s in seqs)


def max_identical_steps(sched: Scheduler, seqs: list[Sequence]) -> int:
    """How many decode steps after the current one (not yet updated) can be advanced at once.

    The current step leaves each sequence one token longer; a later step j must neither finish a
    sequence (max_tokens or max_model_len) nor run out of blocks. Waiting requests cannot be admitted
    during the stretch: the current step did not admit them, and free blocks only shrink.
    """
    limit = None
    for s in seqs:
        left = min(s.sampling_params.max_tokens - s.num_output_tokens, sched.max_model_len - len(s)) - 2
        if limit is None or left < limit:
            limit = left
    if limit is None or limit <= 0:
        return 0
    bm = sched.bm
    free = bm.num_free_blocks
    if _blocks_needed(seqs, bm.block_size, limit) <= free:
        return limit
    lo, hi = 0, limit  # need(lo) <= free < need(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _blocks_needed(seqs, bm.block_size, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def advance_decodes(bm: BlockManager, seqs: list[Sequence], k: int, token: int) -> None:
    """Applies k decode steps to seqs (already updated for the current step), as the scheduler would:
    each step allocates the blocks the sequences grow into (in batch order), computes one token per
    sequence, registers newly full blocks and appends the sampled token."""
    bs = bm.block_size
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
