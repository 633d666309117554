"""Per-sequence block tables over a fixed KV pool, with vLLM-style prefix caching.

Each full block is keyed by its chained hash (engine.core.block_hash). A block
found by hash is shared by reference count. When its last user finishes, a cached block stays in
the allocator's LRU free queue, still findable, until allocation evicts it. With an offload tier
(engine.kv_offload, set as `offload`), an evicted cached block is copied there instead of dropped,
and a lookup that runs past the device cache goes on into the tier: those blocks come back in admit().
"""

from __future__ import annotations

from engine.core.block_hash import ROOT, block_hashes
from engine.core.page_allocator import make_allocator
from engine.core.sequence import Sequence

OFFLOADED = -1  # a lookup's block id for a block found in the offload tier, not on the device


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 allocator=None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.allocator = allocator if allocator is not None else make_allocator(num_blocks)
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.block_hash: dict[int, int] = {}  # block id -> its hash, while registered
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # tokens found
        # the offload tier (engine.kv_offload.OffloadTier), duck-typed: store, pin, unpin, load, `in`
        self.offload = None
        self.offload_queries = 0  # tokens looked up in the tier (those the device cache missed)
        self.offload_hits = 0  # tokens found there and loaded
        # told of every block that becomes findable or stops being so (engine.kv_events publishes them
        # as vLLM's KV events): stored(hashes, parent hash or None, token ids), removed(hashes)
        self.listener = None

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, counting evictable cached ones."""
        return self.allocator.num_free

    @property
    def usage(self) -> float:
        """Fraction of the pool held by live requests (vllm:kv_cache_usage_perc)."""
        return 1.0 - self.allocator.num_free / self.num_blocks

    def lookup_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks for the longest cached prefix of seq (block ids, their hashes). Pure.

        A block found only in the offload tier has id OFFLOADED. At least one token is always left
        to compute, so the step yields logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [], []
        blocks, hashes = [], []
        tier = self.offload
        for h in block_hashes(seq.token_ids, self.block_size, 0, (len(seq) - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                if tier is None or h not in tier:
                    break
                block = OFFLOADED
            blocks.append(block)
            hashes.append(h)
        return blocks, hashes

    def can_admit(self, seq: Sequence, hit_blocks: list[int], num_new_tokens: int) -> bool:
        need = cdiv(len(hit_blocks) * self.block_size + num_new_tokens, self.block_size) - len(hit_blocks)
        # hit blocks sitting in the free queue stop being free once shared; offloaded ones need a block
        reclaimed = sum(1 for b in hit_blocks if b != OFFLOADED and self.allocator.is_free(b))
        need += sum(1 for b in hit_blocks if b == OFFLOADED)
        return need <= self.allocator.num_free - reclaimed

    def admit(self, seq: Sequence, hit_blocks: list[int], hit_hashes: list[int]) -> None:
        """Shares the cached prefix with seq (copying its offloaded blocks back) and counts the lookup."""
        for b in hit_blocks:
            if b == OFFLOADED:
                continue
            if self.allocator.is_free(b):
                self.allocator.take(b)
            else:
                self.allocator.incref(b)
        table = list(hit_blocks)
        restored = [i for i, b in enumerate(table) if b == OFFLOADED]
        if restored:
            self._restore(table, restored, [hit_hashes[i] for i in restored])
            if self.listener is not None:  # back on the device
                bs = self.block_size
                for i in restored:
                    self.listener.stored([hit_hashes[i]], hit_hashes[i - 1] if i else None,
                                         seq.token_ids[i * bs:(i + 1) * bs])
        seq.block_table = table
        seq.block_hashes = list(hit_hashes)
        seq.num_computed_tokens = len(hit_blocks) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            on_device = (len(hit_blocks) - len(restored)) * self.block_size
            self.prefix_cache_queries += len(seq)
            self.prefix_cache_hits += on_device
            if self.offload is not None:
                self.offload_queries += len(seq) - on_device
                self.offload_hits += len(restored) * self.block_size

    def _restore(self, table: list[int], where: list[int], hashes: list[int]) -> None:
        """Fresh device blocks for the offloaded entries of table, filled from the tier, registered."""
        tier = self.offload
        tier.pin(hashes)  # the stores that the allocation below triggers must not drop these
        blocks = self.allocator.allocate(len(where))
        if blocks is None:  # can_admit said there was room: undo the shares taken, then refuse
            tier.unpin(hashes)
            self.release([b for b in table if b != OFFLOADED])
            raise RuntimeError(f"admit needs {len(where)} free blocks for offloaded prefix blocks "
                               f"(call can_admit first)")
        self._evict_all(blocks)
        tier.load(hashes, blocks)
        for i, b, h in zip(where, blocks, hashes):
            table[i] = b
            self.register(b, h)  # findable on the device again (the one place a filled block joins)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grows seq's block table to hold num_new_tokens more tokens; all or nothing."""
        need = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table)
        if need <= 0:
            return True
        blocks = self.allocator.allocate(need)
        if blocks is None:
            return False
        self._evict_all(blocks)
        seq.block_table.extend(blocks)
        return True

    def _evict_all(self, blocks: list[int]) -> None:
        """Drops freshly allocated blocks from the prefix cache; the offload tier keeps a copy."""
        evicted = []
        for block in blocks:
            h = self.block_hash.pop(block, None)
            if h is not None and self.cached.get(h) == block:
                del self.cached[h]
                evicted.append((block, h))
        if evicted and self.listener is not None:
            self.listener.removed([h for _, h in evicted])
        if evicted and self.offload is not None:
            self.offload.store(evicted)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers the blocks that the last step filled, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        done = len(seq.block_hashes)
        full = seq.num_computed_tokens // self.block_size
        if full <= done:
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT
        for i, h in enumerate(block_hashes(seq.token_ids, self.block_size, done, full, parent), start=done):
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self.cached and block not in self.block_hash:
                self.cached[h] = block
                self.block_hash[block] = h
                if self.listener is not None:
                    bs = self.block_size
                    self.listener.stored([h], seq.block_hashes[i - 1] if i else None,
                                         seq.token_ids[i * bs:(i + 1) * bs])

    def free(self, seq: Sequence) -> None:
        """Releases seq's blocks, last block first so it is evicted first."""
        for b in reversed(seq.block_table):
            self.allocator.free(b)  # a cached block stays findable until allocation evicts it
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # -- blocks held outside a sequence (KV transfer: a producer's lease, a consumer's landing) ----
    def hold_cached(self, hashes: list[int]) -> list[int]:
        """References the cached blocks of the longest prefix of hashes; their ids."""
        held = []
        for h in hashes:
            block = self.cached.get(h)
            if block is None:
                break
            if self.allocator.is_free(block):
                self.allocator.take(block)
            else:
                self.allocator.incref(block)
            held.append(block)
        return held

    def allocate_blocks(self, n: int) -> list[int] | None:
        """n referenced blocks, evicted from the prefix cache if they were in it; None if too few are free."""
        blocks = self.allocator.allocate(n)
        if blocks:
            self._evict_all(blocks)
        return blocks

    def register(self, block: int, h: int) -> None:
        """Makes a block filled from elsewhere findable by its hash (unless the hash is cached already)."""
        if self.enable_prefix_caching and h not in self.cached and block not in self.block_hash:
            self.cached[h] = block
            self.block_hash[block] = h
            if self.listener is not None:  # its tokens are not known here: a placeholder, as vLLM sends
                self.listener.stored([h], None, [])

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.allocator.free(b)

    def check_no_leak(self) -> list[str]:
        """Problems found when no request holds blocks (empty list = every block free or evictable)."""
        problems = []
        if self.allocator.num_free != self.num_blocks:
            held = [b for b in range(self.num_blocks) if not self.allocator.is_free(b)]
            problems.append(f"{len(held)} blocks still referenced: {held[:10]}")
        for h, b in self.cached.items():
            if self.block_hash.get(b) != h:
                problems.append(f"cache entry for block {b} is inconsistent")
        check = getattr(self.offload, "check", None)  # a tier that can check its own books
        if check is not None:
            problems += [f"offload tier: {p}" for p in check()]
        return problems
