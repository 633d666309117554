"""Routing policies as pure scoring over plain replica state, shared by the simulator and the live router.

A replica is anything with the attributes of ReplicaView (the simulator's replicas, or the live
router's records of scraped metrics). `Router.pick` returns the index of the chosen replica in the
list it was given. The weighted policy follows llm-d's endpoint picker: filter (drop saturated
endpoints unless all are), score (each scorer in [0, 1]), pick the best weighted sum, ties broken
in turn.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, Sequence

import numpy as np

from engine.core.block_hash import block_hashes


class ReplicaView(Protocol):
    id: int
    num_waiting: int  # requests queued in the engine
    num_running: int  # requests in the running batch
    outstanding: int  # requests routed to it and not finished yet
    kv_usage: float  # 0..1


def prefix_hashes(token_ids: Sequence[int], block_tokens: int, max_blocks: int = 256) -> list[int]:
    """Chained hashes of the prompt's full router blocks (coarser than the engine's 16-token blocks)."""
    return list(block_hashes(token_ids, block_tokens, 0, min(len(token_ids) // block_tokens, max_blocks)))


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


def _minmax_score(values: list[float]) -> list[float]:
    """1 for the lowest value, 0 for the highest (llm-d's queue and load scorers)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


SCORERS = {
    "queue": lambda reps, ctx: _minmax_score([r.num_waiting for r in reps]),
    "load": lambda reps, ctx: _minmax_score([r.outstanding for r in reps]),
    "kv": lambda reps, ctx: [1.0 - r.kv_usage for r in reps],
    "prefix": lambda reps, ctx: [ctx["match"](r) for r in reps],
}


class Router:
    def __init__(
        self,
        policy: str = "least_outstanding",
        weights: dict[str, float] | None = None,
        seed: int = 0,
        prefix_lru_blocks: int = 100_000,
        block_tokens: int = 64,
        kv_threshold: float = 0.95,
        queue_threshold: int = 64,
        load_slack: float = 1.25,
        load_margin: int = 2,
    ):
        self.policy = policy
        self.weights = weights or {}
        self.rng = np.random.default_rng(seed)
        self.block_tokens = block_tokens
        self.kv_threshold = kv_threshold
        self.queue_threshold = queue_threshold
        self.load_slack, self.load_margin = load_slack, load_margin
        self.uses_prefix = policy == "prefix_affinity" or self.weights.get("prefix", 0) > 0
        self.index = PrefixIndex(prefix_lru_blocks) if self.uses_prefix else None
        self._turn = 0

    def _tie(self, candidates: list[int]) -> int:
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def _argmin(self, values: list[float]) -> int:
        m = min(values)
        count = values.count(m)
        if count == 1:
            return values.index(m)
        self._turn += 1
        k = self._turn % count  # ties in turn: the k-th replica holding the minimum
        i = -1
        for _ in range(k + 1):
            i = values.index(m, i + 1)
        return i

    def pick(self, replicas: list[ReplicaView], token_ids: Sequence[int] | None = None) -> int:
        if not replicas:
            raise ValueError("no replica to route to")
        hashes = prefix_hashes(token_ids, self.block_tokens) if self.uses_prefix and token_ids else []
        p = self.policy
        if p == "round_robin":
            i = self._turn % len(replicas)
            self._turn += 1
        elif p == "random":
            i = int(self.rng.integers(len(replicas)))
        elif p == "least_outstanding":
            i = self._argmin([r.outstanding for r in replicas])
        elif p == "least_waiting":
            i = self._argmin([r.num_waiting * 1_000_000 + r.outstanding for r in replicas])
        elif p == "kv_aware":
            i = self._argmin([r.kv_usage for r in replicas])
        elif p == "prefix_affinity":
            i = self._prefix_pick(replicas, hashes)
        elif p == "weighted":
            i = self._weighted_pick(replicas, hashes)
        else:
            raise ValueError(f"unknown router policy {p!r}")
        if self.index is not None and hashes:
            self.index.record(replicas[i].id, hashes)
        return i

    def _prefix_pick(self, replicas: list[ReplicaView], hashes: list[int]) -> int:
        # longest cached prefix wins among replicas not much busier than the least loaded one
        # (bounded load: a prefix every request shares, like a system prompt, must not pin them all)
        loads = [r.outstanding for r in replicas]
        bound = min(loads) * self.load_slack + self.load_margin
        if hashes:
            cands = [i for i, v in enumerate(loads) if v <= bound]
            matches = [self.index.match(replicas[i].id, hashes) for i in cands]
            best = max(matches)
            if best > 0:
                cands = [c for c, m in zip(cands, matches) if m == best]
                low = min(loads[c] for c in cands)
                return self._tie([c for c in cands if loads[c] == low])
        return self._argmin(loads)

    def _weighted_pick(self, replicas: list[ReplicaView], hashes: list[int]) -> int:
        keep = [
            i
            for i, r in enumerate(replicas)
            if r.kv_usage <= self.kv_threshold and r.num_waiting <= self.queue_threshold
        ]
        cand_idx = keep or list(range(len(replicas)))
        cands = [replicas[i] for i in cand_idx]
        ctx = {"match": lambda r: self.index.match(r.id, hashes) / len(hashes) if hashes else 0.0}
        total = [0.0] * len(cands)
        for name, w in self.weights.items():
            if w:
                for j, s in enumerate(SCORERS[name](cands, ctx)):
                    total[j] += w * s
        best = max(total)
        return cand_idx[self._tie([j for j, t in enumerate(total) if t == best])]

    def forget(self, replica_id: int) -> None:
        """A replica went away: its cached prefixes went with it."""
        if self.index is not None:
            self.index.forget(replica_id)
