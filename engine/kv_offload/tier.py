"""The offload tier: an LRU book of block hashes (lru.OffloadIndex) over a copier that moves blocks.

Torch-free. The block manager calls store() with the prefix-cache blocks it is about to reuse
(their contents are still intact: the new owner writes them only in the coming forward pass) and
load() when a prefix lookup continues past the device cache into this tier. Both copies run
synchronously inside the scheduling of the step that needs them, so their cost lands in that
step's time. A copier is either copier.TensorCopier (a real host pool) or TimedCopier (no data:
the emulated engine's time at a given bandwidth).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from engine.kv_offload.lru import Listener, OffloadIndex


class Copier(Protocol):
    def store(self, blocks: list[int], slots: list[int]) -> float: ...  # device -> tier; seconds
    def load(self, slots: list[int], blocks: list[int]) -> float: ...  # tier -> device; seconds


class OffloadTier:
    def __init__(self, num_slots: int, block_bytes: int, copier: Copier, medium: str = "CPU"):
        self.index = OffloadIndex(num_slots, medium)
        self.block_bytes = block_bytes
        self.copier = copier
        self.stored_blocks = self.loaded_blocks = 0
        self.store_seconds = self.load_seconds = 0.0

    @property
    def medium(self) -> str:
        return self.index.medium

    @property
    def num_slots(self) -> int:
        return self.index.num_slots

    @property
    def capacity_bytes(self) -> int:
        return self.index.num_slots * self.block_bytes

    def add_listener(self, on_stored: Listener | None = None, on_removed: Listener | None = None) -> None:
        """Called with (block hashes, medium) whenever hashes enter or leave this tier."""
        if on_stored is not None:
            self.index.on_stored.append(on_stored)
        if on_removed is not None:
            self.index.on_removed.append(on_removed)

    def __contains__(self, h: int) -> bool:
        return h in self.index

    def store(self, pairs: list[tuple[int, int]]) -> None:
        """Copies evicted device blocks [(block id, hash)] in; a hash held already is only touched."""
        if not pairs:
            return
        block_of = {h: b for b, h in pairs}
        placed = self.index.insert(h for _, h in pairs)
        if placed:
            self.store_seconds += self.copier.store([block_of[h] for h, _ in placed], [s for _, s in placed])
            self.stored_blocks += len(placed)

    def pin(self, hashes: list[int]) -> None:
        """Holds hashes in the tier until load() (stores made meanwhile cannot drop them)."""
        self.index.pin(hashes)

    def unpin(self, hashes: list[int]) -> None:
        self.index.unpin(hashes)

    def load(self, hashes: list[int], blocks: list[int]) -> None:
        """Copies the pinned hashes into the given device blocks and unpins them; they stay stored."""
        try:
            slots = [self.index.slot(h) for h in hashes]
            self.load_seconds += self.copier.load(slots, blocks)
            self.loaded_blocks += len(blocks)
        finally:
            self.index.unpin(hashes)

    def check(self) -> list[str]:
        return self.index.check()


class TimedCopier:
    """No data, only time: each copy takes bytes / bandwidth, owed to the next step (the emulated
    engine sleeps it). Stores are free by default: vLLM writes to the host asynchronously, on a
    copy engine beside the compute, so only loads hold a step back."""

    def __init__(self, bandwidth_gbs: float, block_bytes: int, charge_stores: bool = False):
        if not bandwidth_gbs > 0:
            raise ValueError(f"offload bandwidth must be > 0 GB/s, got {bandwidth_gbs}")
        self.seconds_per_block = block_bytes / (bandwidth_gbs * 1e9)
        self.charge_stores = charge_stores
        self.pending_s = 0.0

    def store(self, blocks: list[int], slots: list[int]) -> float:
        s = len(blocks) * self.seconds_per_block
        if self.charge_stores:
            self.pending_s += s
        return s

    def load(self, slots: list[int], blocks: list[int]) -> float:
        s = len(blocks) * self.seconds_per_block
        self.pending_s += s
        return s

    def take_pending(self) -> float:
        """Seconds of copying owed since the last call (the emulated runner adds them to a step)."""
        s, self.pending_s = self.pending_s, 0.0
        return s


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
