"""Routing policies as pure scoring over plain replica state, shared by the simulator and the live router.

A replica is anything with the attributes of ReplicaView (the simulator's replicas, or the live
router's records of scraped metrics). `Router.pick` returns the index of the chosen replica in the
list it was given, chosen by the registered picker its policy names (routing.pickers). The weighted
policy follows llm-d's endpoint picker: filter (drop saturated endpoints unless all are), score (each
scorer in [0, 1], routing.scorers), pick the best weighted sum, ties broken in turn or at random
(seeded).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from routing.pickers import PICKERS
from routing.prefix import PrefixIndex, prefix_hashes, text_hashes
from routing.scorers import SCORER_PLUGINS, SCORERS, ReplicaView, minmax_score, routable

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
        if policy not in PICKERS:
            raise ValueError(f"unknown router policy {policy!r} (registered: {', '.join(PICKERS)})")
        unknown = sorted(set(self.weights) - set(SCORER_PLUGINS))
        if unknown:
            raise ValueError(f"unknown scorer(s) {', '.join(unknown)} "
                             f"(registered: {', '.join(SCORER_PLUGINS)})")
        self._picker = PICKERS[policy].fn
        scorers = [SCORER_PLUGINS[name] for name, w in self.weights.items() if w]
        self.uses_prefix = PICKERS[policy].uses_prefix or any(s.uses_prefix for s in scorers)
        self.index = PrefixIndex(prefix_lru_blocks) if self.uses_prefix else None
        uses_session = any(s.uses_session for s in scorers)
        self.sessions: OrderedDict[str, int] | None = OrderedDict() if uses_session else None
        self._turn = 0
        self.kv_index = None  # routing.kv_index.KVBlockIndex for the precise scorer, fed by its owner

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
        i = self._picker(self, replicas, hashes, session)  # routing.pickers
        if self.index is not None and hashes:
            self.index.record(replicas[i].id, hashes)
        if self.sessions is not None and session is not None:
            self.sessions[session] = replicas[i].id
            self.sessions.move_to_end(session)
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
        return i

    def forget(self, replica_id: int) -> None:
        """A replica went away: its cached prefixes went with it."""
        if self.index is not None:
            self.index.forget(replica_id)
        if self.kv_index is not None:
            self.kv_index.forget(replica_id)
