"""The chained block hash: a full block of tokens is known by (its parent block's hash, its token ids).

Two prompts share the hashes of their common full-block prefix and differ from the first block
that differs. The block manager keys its prefix cache on these, and the router scores prefix
affinity on the same hashes over coarser blocks. Python's hash of a tuple of ints is the same in
every process (no hash randomisation for ints), so the values are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

ROOT = 0  # the parent of the first block


def block_hashes(token_ids: Sequence[int], block_size: int, start: int, stop: int,
                 parent: int = ROOT) -> Iterator[int]:
    """Hashes of full blocks start..stop-1, chained from parent (the hash of block start-1)."""
    for i in range(start, stop):
        parent = hash((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        yield parent
