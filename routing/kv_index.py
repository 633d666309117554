"""The precise prefix index: which blocks each endpoint holds, and on which medium, from its KV events.

Keys are the router's own chained block hash (engine.core.block_hash) over the endpoint's block
size, so a request's prefix hashes (routing.prefix.prefix_hashes) look blocks up directly. An engine
that publishes that same hash (ours) is read as is; for any other (vLLM's sha256-based hashes) the
key of each stored block is computed from its parent's key and its token ids, and the engine's hash
is kept only to find the block again when it is removed. A stored block whose parent the index does
not know (events missed before a resync) cannot be keyed and is counted in `orphans`.

Writers (a subscriber thread, or the simulator feeding its replicas' caches) and readers (the
router's scorer) may be on different threads: every call takes the index's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from engine.core.block_hash import ROOT
from engine.core.kv_events import MEDIUM_DEVICE, AllBlocksCleared, BlockRemoved, BlockStored, Event

log = logging.getLogger("routing.kv_index")

# llm-d's precise scorer weighs a host-memory hit below a device hit (gpu 1.0, cpu 0.8)
DEFAULT_MEDIUM_WEIGHTS = {MEDIUM_DEVICE: 1.0, "CPU": 0.8}
OTHER_MEDIUM_WEIGHT = 0.5  # a tier the weights do not name (disk, a remote store)


@dataclass
class EndpointBlocks:
    media: dict[int, set[str]] = field(default_factory=dict)  # key -> media holding the block
    keys: dict[int | bytes, int] = field(default_factory=dict)  # engine hash -> key (translated engines)
    native: bool | None = None  # the engine's hashes are our keys (None: not known yet)


class KVBlockIndex:
    def __init__(self, block_size: int | None = None, medium_weights: dict[str, float] | None = None):
        """block_size: the router's prefix block (events of another size are ignored and counted)."""
        self.block_size = block_size
        self.weights = dict(DEFAULT_MEDIUM_WEIGHTS if medium_weights is None else medium_weights)
        self._eps: dict[Hashable, EndpointBlocks] = {}
        self._lock = threading.Lock()
        self.orphans = 0  # stored blocks whose parent was unknown
        self.mismatched = 0  # events of another block size
        self.malformed = 0  # token ids not a whole number of blocks

    # -- writers ---------------------------------------------------------------------------------
    def apply(self, endpoint: Hashable, events: Sequence[Event]) -> None:
        with self._lock:
            ep = self._eps.setdefault(endpoint, EndpointBlocks())
            for e in events:
                if isinstance(e, BlockStored):
                    self._stored(endpoint, ep, e)
                elif isinstance(e, BlockRemoved):
                    self._removed(ep, e.block_hashes, e.medium or MEDIUM_DEVICE)
                elif isinstance(e, AllBlocksCleared):
                    self._eps[endpoint] = ep = EndpointBlocks(native=ep.native)

    def store_keys(self, endpoint: Hashable, keys: Sequence[int], medium: str = MEDIUM_DEVICE) -> None:
        """Blocks known by their keys (the simulator's replicas: the engine's own hashes)."""
        with self._lock:
            media = self._eps.setdefault(endpoint, EndpointBlocks(native=True)).media
            for k in keys:
                media.setdefault(k, set()).add(medium)

    def remove_keys(self, endpoint: Hashable, keys: Sequence[int], medium: str = MEDIUM_DEVICE) -> None:
        with self._lock:
            ep = self._eps.get(endpoint)
            if ep is not None:
                self._removed(ep, keys, medium)

    def clear(self, endpoint: Hashable) -> None:
        """Forget what the endpoint holds (a resync: stale blocks would score it for prefixes it lost)."""
        with self._lock:
            ep = self._eps.get(endpoint)
            if ep is not None:
                self._eps[endpoint] = EndpointBlocks(native=ep.native)

    def forget(self, endpoint: Hashable) -> None:
        with self._lock:
            self._eps.pop(endpoint, None)

    def _stored(self, endpoint: Hashable, ep: EndpointBlocks, e: BlockStored) -> None:
        if not e.token_ids:  # a placeholder (an offload tier's block it could not describe)
            if ep.native:
                for h in e.block_hashes:
                    ep.media.setdefault(h, set()).add(e.medium or MEDIUM_DEVICE)
            else:
                self.orphans += len(e.block_hashes)
            return
        if self.block_size is not None and e.block_size != self.block_size:
            if not self.mismatched:
                log.warning("KV events of %s have block size %d, the router's prefix blocks %d: ignored "
                            "(set the scorer's blockSize to the engines')", endpoint, e.block_size,
                            self.block_size)
            self.mismatched += 1
            return
        bs, n = e.block_size, len(e.block_hashes)
        if len(e.token_ids) != n * bs:
            self.malformed += 1
            return
        medium = e.medium or MEDIUM_DEVICE
        parent: int | None = ROOT
        if e.parent_block_hash is not None:
            parent = e.parent_block_hash if ep.native else ep.keys.get(e.parent_block_hash)
        if parent is None:  # the chain is broken (events missed): nothing here can be keyed
            self.orphans += n
            return
        for i, h in enumerate(e.block_hashes):
            key = hash((parent, tuple(e.token_ids[i * bs:(i + 1) * bs])))
            if ep.native is None:  # the first block the index keys tells whether the hashes are ours
                ep.native = key == h
            if ep.native:
                key = h
            else:
                ep.keys[h] = key
            ep.media.setdefault(key, set()).add(medium)
            parent = key

    def _removed(self, ep: EndpointBlocks, hashes: Sequence, medium: str) -> None:
        for h in hashes:
            key = h if ep.native else ep.keys.get(h)
            held = ep.media.get(key) if key is not None else None
            if held is None:
                continue
            held.discard(medium)
            if not held:
                del ep.media[key]
                if not ep.native:
                    ep.keys.pop(h, None)

    # -- readers ---------------------------------------------------------------------------------
    def match(self, endpoint: Hashable, keys: Sequence[int]) -> list[str]:
        """The medium of each leading block the endpoint holds (the device when it has both), up to
        the first block it does not hold."""
        with self._lock:
            ep = self._eps.get(endpoint)
            if ep is None:
                return []
            out = []
            for k in keys:
                held = ep.media.get(k)
                if not held:
                    break
                out.append(MEDIUM_DEVICE if MEDIUM_DEVICE in held else min(held))
            return out

    def score(self, endpoint: Hashable, keys: Sequence[int]) -> float:
        """The weighted share of the request's blocks the endpoint holds as its prefix, in [0, 1]."""
        if not keys:
            return 0.0
        w = self.weights
        return sum(w.get(m, OTHER_MEDIUM_WEIGHT) for m in self.match(endpoint, keys)) / len(keys)

    def blocks(self, endpoint: Hashable, medium: str | None = None) -> int:
        """How many blocks the endpoint holds (on `medium`, or on any)."""
        with self._lock:
            ep = self._eps.get(endpoint)
            if ep is None:
                return 0
            return sum(1 for held in ep.media.values() if medium is None or medium in held)

    def by_medium(self) -> dict[Hashable, dict[str, int]]:
        """Blocks held, per endpoint and medium (a block on two media counts on each)."""
        with self._lock:
            out: dict[Hashable, dict[str, int]] = {}
            for key, ep in self._eps.items():
                counts = out.setdefault(key, {})
                for held in ep.media.values():
                    for m in held:
                        counts[m] = counts.get(m, 0) + 1
            return out

    def endpoints(self) -> list[Hashable]:
        with self._lock:
            return list(self._eps)
