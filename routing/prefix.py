"""Prefix affinity: chained hashes of a prompt's leading blocks, and a per-replica LRU of them.

With token ids (the tokenizer is known) the hashes are the engine block manager's own chained block
hash over `block_tokens`-token blocks; with text only, the same chain runs over UTF-8 byte blocks.
The index is approximate: it remembers what was routed where, not what each engine still caches.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from engine.core.block_hash import block_hashes

MAX_BLOCKS = 256  # leading blocks hashed per request


def prefix_hashes(token_ids: Sequence[int], block_tokens: int, max_blocks: int = MAX_BLOCKS) -> list[int]:
    """Chained hashes of the prompt's full blocks (at most max_blocks)."""
    return list(block_hashes(token_ids, block_tokens, 0, min(len(token_ids) // block_tokens, max_blocks)))


def text_hashes(text: str, block_chars: int, max_blocks: int = MAX_BLOCKS) -> list[int]:
    """The same chain over the text's UTF-8 bytes, in blocks of block_chars bytes."""
    return prefix_hashes(text.encode("utf-8"), block_chars, max_blocks)


class PrefixIndex:
    """An approximate per-replica LRU of the prefix blocks routed to it (what it probably has cached)."""

    def __init__(self, capacity_blocks: int):
        self.capacity = capacity_blocks
        self.lru: dict[int, OrderedDict[int, None]] = {}

    def match(self, replica_id: int, hashes: list[int]) -> int:
        """Number of leading blocks of the request the replica has seen."""
        lru = self.lru.get(replica_id)
        if not lru:
            return 0
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def record(self, replica_id: int, hashes: list[int]) -> None:
        lru = self.lru.setdefault(replica_id, OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def forget(self, replica_id: int) -> None:
        self.lru.pop(replica_id, None)

    def size(self) -> int:
        return sum(len(v) for v in self.lru.values())
