"""The precise prefix scorer: the share of a request's leading blocks each endpoint really holds.

It reads the router's KVBlockIndex (routing.kv_index), fed by the engines' KV events live
(routing.kv_subscriber) or by the simulated replicas' caches, unlike the `prefix` scorer's guess of
what was routed where. A block on the device counts fully, one in an offload tier by its medium's
weight (llm-d's gpu 1.0, cpu 0.8). The request's hashes must be over the engines' block size
(the scorer's blockSize); an endpoint the index has not heard from scores 0.
"""

from __future__ import annotations

from autoscaler.yamlfile import Document
from routing.kv_index import DEFAULT_MEDIUM_WEIGHTS
from routing.scorers import register_scorer

NAME = "precise_prefix"
PLUGIN_TYPE = "precise-prefix-cache-scorer"  # llm-d's name


def index_key(replica):
    """The index's key for a replica: a live endpoint's URL, a simulated replica's id."""
    return getattr(replica, "url", None) or replica.id


def precise_prefix(replicas: list, ctx: dict) -> list[float]:
    index, hashes = ctx.get("kv_index"), ctx.get("hashes")
    if index is None or not hashes:
        return [0.0] * len(replicas)
    return [index.score(index_key(r), hashes) for r in replicas]


def uses_index(weights: dict[str, float]) -> bool:
    return bool(weights.get(NAME))


register_scorer(NAME, PLUGIN_TYPE, precise_prefix, uses_prefix=True)


DEFAULT_ZMQ_ENDPOINT = "tcp://*:5557"  # llm-d's default for its KV events indexer
OWN_PARAMS = ("zmqEndpoint", "mediumWeights")


def precise_params(doc: Document, where: tuple, params: dict, cfg) -> dict:
    """Reads the scorer's own parameters into cfg; returns the rest (the prefix scorer's)."""
    ep = params.get("zmqEndpoint", DEFAULT_ZMQ_ENDPOINT)
    if not isinstance(ep, str) or not ep.startswith(("tcp://", "ipc://", "inproc://")):
        raise doc.error((*where, "zmqEndpoint"), f"must be a ZMQ address such as tcp://*:5557, got {ep!r}")
    weights = params.get("mediumWeights", DEFAULT_MEDIUM_WEIGHTS)
    if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
            for k, v in weights.items()):
        raise doc.error((*where, "mediumWeights"),
                        "must map medium names (GPU, CPU, ...) to weights in [0, 1]")
    cfg.kv_events_endpoint, cfg.kv_medium_weights = ep, {k: float(v) for k, v in weights.items()}
    rest = {k: v for k, v in params.items() if k not in OWN_PARAMS}
    rest.setdefault("blockSize", 16)  # the engines' (ours and vLLM's GPU default), not 64-byte text blocks
    return rest


class IndexFeed:
    """A block manager's listener writing straight into the index (the simulator's replicas: their
    caches are the engine's own, so the events need no wire)."""

    def __init__(self, index, key, medium: str = "GPU"):
        self.index, self.key, self.medium = index, key, medium

    def stored(self, hashes: list[int], parent, token_ids, medium: str | None = None) -> None:
        self.index.store_keys(self.key, hashes, medium or self.medium)

    def removed(self, hashes: list[int], medium: str | None = None) -> None:
        self.index.remove_keys(self.key, hashes, medium or self.medium)

    def attach(self, block_manager) -> None:
        """Listen to a block manager and to its offload tier, if it has one."""
        block_manager.listener = self
        tier = getattr(block_manager, "offload", None)
        if tier is not None:
            tier.add_listener(self.index_tier_stored, self.index_tier_removed)

    def index_tier_stored(self, hashes: list[int], medium: str) -> None:
        self.index.store_keys(self.key, hashes, medium)

    def index_tier_removed(self, hashes: list[int], medium: str) -> None:
        self.index.remove_keys(self.key, hashes, medium)
