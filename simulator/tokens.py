"""Synthetic prompt token ids, deterministic per request.

Only equality matters to the prefix cache, so ids are arbitrary integers: a Mooncake hash block h
(512 tokens) always becomes the same 512 ids, so equal hash_ids give equal 16-token blocks in the
block manager's hashing; everything else is unique to its request, so it never hits by accident.
"""

from __future__ import annotations

MOONCAKE_BLOCK = 512
_UNIQUE_BASE = 1 << 40  # above every hash-block id range


def prompt_token_ids(
    index: int, length: int, hash_ids: list[int] | None = None, hash_block: int = MOONCAKE_BLOCK
) -> list[int]:
    """Token ids for request `index`: shared blocks from hash_ids, then request-unique ids."""
    ids: list[int] = []
    if hash_ids:
        for h in hash_ids:
            if len(ids) >= length:
                break
            base = h * hash_block
            ids.extend(range(base, base + min(hash_block, length - len(ids))))
    if len(ids) < length:
        base = _UNIQUE_BASE + index * (1 << 22) + len(ids)
        ids.extend(range(base, base + length - len(ids)))
    return ids
