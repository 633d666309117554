"""A block manager that only counts blocks, for pools without prefix caching.

Without a prefix cache no block's identity is ever observed (nothing is shared, nothing is looked
up), so the engine's BlockManager can be replaced by a count of free blocks: the scheduler makes
exactly the same decisions (admission, chunking, preemption), at O(1) per request instead of O(blocks)
for freeing. tests/simulator/test_sim_fastpath.py checks that a run with it gives the same per-request timings
as a step-by-step run on the engine's own BlockManager.
"""

from __future__ import annotations

from engine.core.block_manager import BlockManager, cdiv
from engine.core.sequence import Sequence


class CountingBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int = 16):
        if block_size < 1 or num_blocks < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = False
        self.allocator = None
        self.cached, self.block_hash = {}, {}
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        self._free = num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._free

    @property
    def usage(self) -> float:
        return 1.0 - self._free / self.num_blocks

    def lookup_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        return [], []

    def can_admit(self, seq: Sequence, hit_blocks: list[int], num_new_tokens: int) -> bool:
        return cdiv(num_new_tokens, self.block_size) <= self._free

    def admit(self, seq: Sequence, hit_blocks: list[int], hit_hashes: list[int]) -> None:
        seq.block_table, seq.block_hashes = [], []
        seq.num_computed_tokens = seq.num_cached_tokens = 0

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table)
        if need <= 0:
            return True
        if need > self._free:
            return False
        self._free -= need
        seq.block_table.extend([-1] * need)  # placeholder ids: only the count matters
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        self._free += len(seq.block_table)
        seq.block_table, seq.block_hashes = [], []
        seq.num_computed_tokens = 0

    def check_no_leak(self) -> list[str]:
        held = self.num_blocks - self._free
        return [f"{held} blocks still held"] if held else []
