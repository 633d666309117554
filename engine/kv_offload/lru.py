"""The offload tier's book: which block hash sits in which host slot, least recently used first.

Torch-free. A fixed number of slots; storing into a full tier drops the least recently used
entry that is not pinned (a pin holds an entry while it is being copied back to the device).
Observers see every hash that enters or leaves (`on_stored(hashes, medium)`,
`on_removed(hashes, medium)`), which is what a KV-events publisher needs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

Listener = Callable[[list[int], str], None]


class OffloadIndex:
    def __init__(self, num_slots: int, medium: str = "CPU"):
        if num_slots < 1:
            raise ValueError(f"the offload tier needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self.medium = medium
        self._slots: OrderedDict[int, int] = OrderedDict()  # hash -> slot, LRU first
        self._free = list(range(num_slots - 1, -1, -1))
        self._pins: dict[int, int] = {}  # hash -> pin count
        self.on_stored: list[Listener] = []
        self.on_removed: list[Listener] = []
        self.evictions = 0  # entries dropped to make room
        self.stores_skipped = 0  # stores refused: every entry pinned

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, h: int) -> bool:
        return h in self._slots

    @property
    def usage(self) -> float:
        return len(self._slots) / self.num_slots

    def slot(self, h: int) -> int | None:
        return self._slots.get(h)

    def touch(self, h: int) -> None:
        """Marks h most recently used."""
        self._slots.move_to_end(h)

    def hashes(self) -> list[int]:
        """Every stored hash, least recently used first."""
        return list(self._slots)

    def insert(self, hashes: Iterable[int]) -> list[tuple[int, int]]:
        """Slots for new hashes, evicting LRU entries as needed: [(hash, slot)] for those that got one.
        A hash already stored is only touched; a store that finds every entry pinned is skipped."""
        placed, removed = [], []
        for h in hashes:
            if h in self._slots:
                self.touch(h)
                continue
            if not self._free:
                victim = next((v for v in self._slots if v not in self._pins), None)
                if victim is None:
                    self.stores_skipped += 1
                    continue
                self._free.append(self._slots.pop(victim))
                self.evictions += 1
                removed.append(victim)
            slot = self._free.pop()
            self._slots[h] = slot
            placed.append((h, slot))
        self._notify(self.on_removed, removed)
        self._notify(self.on_stored, [h for h, _ in placed])
        return placed

    def pin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            if h not in self._slots:
                raise KeyError(f"cannot pin hash {h}: not in the offload tier")
            self._pins[h] = self._pins.get(h, 0) + 1
            self.touch(h)

    def unpin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self._pins.get(h, 0)
            if n == 0:
                raise ValueError(f"hash {h} is not pinned")
            if n == 1:
                del self._pins[h]
            else:
                self._pins[h] = n - 1

    def clear(self) -> None:
        removed = list(self._slots)
        self._slots.clear()
        self._pins.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._notify(self.on_removed, removed)

    def check(self) -> list[str]:
        """Problems with the books (empty: consistent); pins must be zero when nothing is loading."""
        problems = []
        used = set(self._slots.values())
        if len(used) != len(self._slots):
            problems.append("two hashes share a slot")
        if used & set(self._free) or len(used) + len(self._free) != self.num_slots:
            problems.append(f"slots lost or doubled: {len(used)} used + {len(self._free)} free "
                            f"!= {self.num_slots}")
        if self._pins:
            problems.append(f"{len(self._pins)} entries still pinned")
        return problems

    def _notify(self, listeners: list[Listener], hashes: list[int]) -> None:
        if hashes:
            for fn in listeners:
                fn(hashes, self.medium)
