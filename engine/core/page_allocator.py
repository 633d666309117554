"""Pure-Python page allocator, behaving exactly like the native one in csrc/page_allocator.cpp.

A fixed pool of KV blocks with reference counts. Free blocks wait in an LRU queue: allocation
takes from the head (least recently freed), a block whose last reference drops goes to the tail.
"""

from __future__ import annotations

from collections import OrderedDict


class PyPageAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self._n = num_blocks
        self._ref = [0] * num_blocks
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def capacity(self) -> int:
        return self._n

    @property
    def num_free(self) -> int:
        return len(self._queue)

    def _check(self, b: int) -> None:
        if not 0 <= b < self._n:
            raise ValueError(f"block id {b} out of range [0, {self._n})")

    def allocate(self, n: int) -> list[int] | None:
        """n blocks, all or none (None when fewer than n are free)."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks: {n}")
        if n > len(self._queue):
            return None
        out = []
        for _ in range(n):
            b, _ = self._queue.popitem(last=False)
            self._ref[b] = 1
            out.append(b)
        return out

    def take(self, b: int) -> None:
        self._check(b)
        if b not in self._queue:
            raise ValueError(f"block {b} is not free")
        del self._queue[b]
        self._ref[b] = 1

    def incref(self, b: int) -> int:
        self._check(b)
        if self._ref[b] == 0:
            raise ValueError(f"cannot incref free block {b}")
        self._ref[b] += 1
        return self._ref[b]

    def free(self, b: int) -> bool:
        self._check(b)
        if self._ref[b] == 0:
            raise ValueError(f"double free of block {b}")
        self._ref[b] -= 1
        if self._ref[b] > 0:
            return False
        self._queue[b] = None
        return True

    def refcount(self, b: int) -> int:
        self._check(b)
        return self._ref[b]

    def is_free(self, b: int) -> bool:
        self._check(b)
        return b in self._queue

    def free_queue(self) -> list[int]:
        return list(self._queue)


def make_allocator(num_blocks: int, prefer_native: bool = True):
    """The native allocator when the extension is built, else the Python one."""
    if prefer_native:
        try:
            from engine._page_allocator import PageAllocator
        except ImportError:
            pass
        else:
            return PageAllocator(num_blocks)
    return PyPageAllocator(num_blocks)
