"""The KV blocks a decode stretch in progress has grown into, seen from outside the replica.

A fast-forwarded stretch (simulator.fastforward) takes its blocks when it ends; a step-by-step run
takes each at the start of the step that needs it. Between the two, what the KV cache holds at an
instant (a router's KV usage, a P/D reservation, a prefix lookup) is read or taken here from the
stretch's record `grow` = (start ps, a, b, c0, n, steps, seqs) of simulator.replica.
"""

from __future__ import annotations

from engine.core.block_manager import BlockManager
from simulator.steptime import steps_reaching


def _started(grow: tuple, now: int) -> int:
    """The stretch's steps begun by `now` (blocks grow at a step's start)."""
    t0, a, b, c0, n, steps, _ = grow
    return min(steps, steps_reaching(a, b, c0, n, now - t0 + 1))


def grown_blocks(bm: BlockManager, grow: tuple, now: int) -> int:
    """Blocks the stretch has grown into by `now`, not yet taken from the manager."""
    started, bs = _started(grow, now), bm.block_size
    return sum(max(0, -(-(s.num_computed_tokens + started) // bs) - len(s.block_table)) for s in grow[6])


def take_grown_blocks(bm: BlockManager, grow: tuple, now: int) -> None:
    """Takes now the blocks the stretch has grown into, in a step-by-step run's order."""
    started, bs, seqs = _started(grow, now), bm.block_size, grow[6]
    order = sorted((j, i) for i, s in enumerate(seqs)  # the steps where each one starts a block
                   for j in range(max(len(s.block_table) * bs - s.num_computed_tokens + 1, 1),
                                  started + 1, bs))
    for j, i in order:  # step j computes token c + j - 1: one more slot from c + j - 1 computed
        s = seqs[i]
        computed, s.num_computed_tokens = s.num_computed_tokens, s.num_computed_tokens + j - 1
        bm.append_slots(s, 1)
        s.num_computed_tokens = computed
