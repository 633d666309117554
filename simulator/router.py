"""Routing policies as pure scoring over plain replica state, shared by the simulator and the live router.

A replica is anything with the attributes of ReplicaView (the simulator's replicas, or the live
router's records of scraped metrics). `Router.pick` returns the index of the chosen replica in the
list it was given. The weighted policy follows llm-d's endpoint picker: filter (drop saturated
endpoints unless all are), score (each scorer in [0, 1], simulator.scorers), pick the best weighted
sum, ties broken in turn or at random (seeded).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from simulator.prefix import PrefixIndex, prefix_hashes, text_hashes
from simulator.scorers import SCORERS, ReplicaView, below_thresholds, minmax_score, routable

__all__ = ["SCORERS", "PrefixIndex", "ReplicaView", "Router", "minmax_score", "prefix_hashes", "routable",
           "text_hashes"]

TIES = ("turn", "random")
MAX_SESSIONS = 100_000  # sessions remembered for session affinity (least recent forgotten first)


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
        ties: str = "turn",
    ):
        if ties not in TIES:
            raise ValueError(f"ties must be one of {', '.join(TIES)}, got {ties!r}")
        self.policy = policy
        self.weights = weights or {}
        self.rng = np.random.default_rng(seed)
        self.block_tokens = block_tokens
        self.kv_threshold = kv_threshold
        self.queue_threshold = queue_threshold
        self.load_slack, self.load_margin = load_slack, load_margin
        self.ties = ties
        self.uses_prefix = policy == "prefix_affinity" or self.weights.get("prefix", 0) > 0
        self.index = PrefixIndex(prefix_lru_blocks) if self.uses_prefix else None
        self.sessions: OrderedDict[str, int] | None = OrderedDict() if self.weights.get("session") else None
        self._turn = 0

    def _tie(self, candidates: list[int]) -> int:
        if self.ties == "random" and len(candidates) > 1:
            return candidates[int(self.rng.integers(len(candidates)))]
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def _argmin(self, values: list[float]) -> int:
        m = min(values)
        count = values.count(m)
        if count == 1:
            return values.index(m)
        if self.ties == "random":
            return self._tie([i for i, v in enumerate(values) if v == m])
        self._turn += 1
        k = self._turn % count  # ties in turn: the k-th replica holding the minimum
        i = -1
        for _ in range(k + 1):
            i = values.index(m, i + 1)
        return i

    def pick(self, replicas: list[ReplicaView], token_ids: Sequence[int] | None = None, *,
             hashes: list[int] | None = None, session: str | None = None) -> int:
        """The index of the chosen replica. token_ids (or precomputed prefix `hashes`) feed prefix
        affinity; `session` (a client's session key) feeds session affinity."""
        if not replicas:
            raise ValueError("no replica to route to")
        if hashes is None:
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
            i = self._weighted_pick(replicas, hashes, session)
        else:
            raise ValueError(f"unknown router policy {p!r}")
        if self.index is not None and hashes:
            self.index.record(replicas[i].id, hashes)
        if self.sessions is not None and session is not None:
            self.sessions[session] = replicas[i].id
            self.sessions.move_to_end(session)
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
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

    def _weighted_pick(self, replicas: list[ReplicaView], hashes: list[int], session: str | None) -> int:
        keep = below_thresholds(replicas, self.kv_threshold, self.queue_threshold)
        cand_idx = keep or list(range(len(replicas)))
        cands = [replicas[i] for i in cand_idx]
        ctx = {"match": lambda r: self.index.match(r.id, hashes) / len(hashes) if hashes else 0.0}
        if self.sessions is not None and session is not None:
            ctx["session"] = self.sessions.get(session)
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
