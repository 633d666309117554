"""A pool's KV offload tier: host memory behind each replica's GPU KV cache, in the simulator.

    pools:
      - name: h100
        ...
        kv_offload:
          capacity_gib: 256         # host memory a replica keeps KV blocks in (or capacity_blocks)
          bandwidth_gbs: 100        # GB/s (1e9 bytes) host -> GPUs, all of the replica's GPUs together
          price_per_gib_hour: 0.004 # added to the pool's cost_per_hour (0 when not given)
          kv_bytes_per_token: 327680  # optional: kv_memory's or a derived model's otherwise

A prefix-cache block that allocation evicts from device memory is kept in the tier instead of lost
(the tier drops its least recently used block when full). A request whose cached prefix continues in
the tier loads those blocks back instead of recomputing them; the step that admits it pays the copy,
bytes per block / bandwidth, in place of their prefill compute. The copy out at eviction is taken as
overlapped with compute (free), as vLLM's offloading connector stores asynchronously.

Counters, by tier (tier_summary, in the report): tokens found on device (vLLM's prefix_cache_hits),
tokens loaded from the tier, tokens looked up, and prompt tokens the replicas computed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from autoscaler.yamlfile import Document
from engine.core.block_manager import BlockManager
from simulator.pd_spec import model_kv_bytes_per_token
from simulator.steptime import PS

GIB = 2**30
MAX_OFFLOAD_BLOCKS = 4_000_000  # a replica's tier, in blocks (its LRU is one dict entry a block)

_POS = {"type": "number", "exclusiveMinimum": 0}
OFFLOAD_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["bandwidth_gbs"],
    "properties": {
        "capacity_gib": {**_POS, "maximum": 1e6},
        "capacity_blocks": {"type": "integer", "minimum": 1, "maximum": MAX_OFFLOAD_BLOCKS},
        "bandwidth_gbs": {**_POS, "maximum": 1e5},
        "kv_bytes_per_token": {**_POS, "maximum": 1e9},
        "price_per_gib_hour": {"type": "number", "minimum": 0, "maximum": 1e3},
    },
    "x-exactly-one": ["capacity_gib", "capacity_blocks"],
}


@dataclass(frozen=True)
class OffloadSpec:
    blocks: int  # the tier's capacity in the pool's blocks
    bandwidth_bytes_s: float
    kv_bytes_per_token: float  # the whole model's (all GPUs of a replica)
    block_size: int
    price_per_gib_hour: float = 0.0

    @property
    def capacity_gib(self) -> float:
        return self.blocks * self.block_size * self.kv_bytes_per_token / GIB

    @property
    def cost_per_hour(self) -> float:
        return self.capacity_gib * self.price_per_gib_hour

    @property
    def load_ps_per_block(self) -> int:
        """The copy of one block from the tier to the GPUs, integer picoseconds."""
        return int(round(self.block_size * self.kv_bytes_per_token / self.bandwidth_bytes_s * PS))


def offload_config(doc: Document, block_size: int, kv_memory: dict | None, latency_model: str,
                   prefix_caching: bool) -> OffloadSpec:
    """The pool's checked `kv_offload` section (doc is that section; the schema has run)."""
    d = doc.data
    have = [k for k in ("capacity_gib", "capacity_blocks") if k in d]
    if len(have) != 1:
        raise doc.error((), "give exactly one of capacity_gib and capacity_blocks")
    if not prefix_caching:
        raise doc.error((), "needs prefix_caching: the tier keeps prefix-cache blocks")
    kv = d.get("kv_bytes_per_token") or (kv_memory or {}).get("kv_bytes_per_token")
    if not kv:
        from simulator.latency import load_latency_model
        from simulator.latency.loader import is_derived

        if is_derived(latency_model):
            kv = model_kv_bytes_per_token(load_latency_model(latency_model))
    if not kv:
        raise doc.error(("kv_bytes_per_token",), "is required: the pool has no kv_memory and its latency "
                        "model is not a derived one whose architecture gives the KV bytes per token")
    kv = float(kv)
    if "capacity_blocks" in d:
        blocks = int(d["capacity_blocks"])
    else:
        blocks = int(float(d["capacity_gib"]) * GIB // (kv * block_size))
        if blocks < 1:
            raise doc.error(("capacity_gib",), f"holds no whole block of {kv * block_size:.0f} bytes")
        if blocks > MAX_OFFLOAD_BLOCKS:
            raise doc.error(("capacity_gib",), f"gives {blocks} blocks a replica, more than the limit of "
                            f"{MAX_OFFLOAD_BLOCKS}; a larger block_size holds the same bytes in fewer")
    return OffloadSpec(blocks, float(d["bandwidth_gbs"]) * 1e9, kv, block_size,
                       float(d.get("price_per_gib_hour", 0.0)))


class SimTier:
    """The offload tier's book in the simulator: the hashes it holds, least recently used first (no
    data: the copy is timed, per block). The engine's offload tier's interface (store, pin, unpin,
    load, `in`, listeners), so the engine's block manager can drive either."""

    def __init__(self, capacity_blocks: int, medium: str = "CPU"):
        self.capacity = capacity_blocks
        self.medium = medium
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.pins: dict[int, int] = {}
        self.stored_blocks = 0  # blocks copied in
        self.loaded_blocks = 0  # blocks copied back to the device
        self.pending = 0  # loaded since the last take_loaded() (the step being timed pays for them)
        self.listeners: list[tuple] = []  # (on_stored, on_removed), each called with (hashes, medium)

    def __contains__(self, h: int) -> bool:
        return h in self.lru

    def __len__(self) -> int:
        return len(self.lru)

    def add_listener(self, on_stored=None, on_removed=None) -> None:
        self.listeners.append((on_stored, on_removed))

    def store(self, pairs: list[tuple[int, int]]) -> None:
        """Evicted device blocks [(block id, hash)] kept; a hash held already is only touched."""
        stored, removed = [], []
        for _, h in pairs:
            if h in self.lru:
                self.lru.move_to_end(h)
                continue
            if len(self.lru) >= self.capacity:
                victim = next((v for v in self.lru if v not in self.pins), None)
                if victim is None:  # everything is being loaded: this store is skipped
                    continue
                del self.lru[victim]
                removed.append(victim)
            self.lru[h] = None
            stored.append(h)
        self.stored_blocks += len(stored)
        for on_stored, on_removed in self.listeners:
            if removed and on_removed:
                on_removed(removed, self.medium)
            if stored and on_stored:
                on_stored(stored, self.medium)

    def pin(self, hashes: list[int]) -> None:
        for h in hashes:
            self.pins[h] = self.pins.get(h, 0) + 1
            self.lru.move_to_end(h)

    def unpin(self, hashes: list[int]) -> None:
        for h in hashes:
            if self.pins[h] == 1:
                del self.pins[h]
            else:
                self.pins[h] -= 1

    def load(self, hashes: list[int], blocks: list[int]) -> None:
        """The pinned hashes copied into device blocks (they stay in the tier), and unpinned."""
        self.loaded_blocks += len(blocks)
        self.pending += len(blocks)
        self.unpin(hashes)

    def take_loaded(self) -> int:
        n, self.pending = self.pending, 0
        return n


class TieredBlockManager(BlockManager):
    """The engine's own block manager (engine.core.block_manager: its offload hook stores evicted
    blocks, runs prefix lookups on into the tier, pins, loads and re-registers them) over a SimTier:
    what the simulated replica keeps is what a live engine with the same tier keeps."""

    def __init__(self, num_blocks: int, block_size: int, offload_blocks: int):
        super().__init__(num_blocks, block_size, True)
        self.offload = SimTier(offload_blocks)


def tier_summary(pool) -> dict:
    """Hit rates by tier and prompt tokens computed, over a pool's replicas (the report's kv_tiers)."""
    reps = pool.replicas
    queries = sum(r.bm.prefix_cache_queries for r in reps)
    device = sum(r.bm.prefix_cache_hits for r in reps)
    offload = sum(getattr(r.bm, "offload_hits", 0) for r in reps)
    spec = pool.spec.kv_offload
    out = {
        "queried_tokens": queries,
        "device_hit_tokens": device,
        "offload_hit_tokens": offload,
        "device_hit_rate": device / queries if queries else None,
        "offload_hit_rate": offload / queries if queries else None,
        "hit_rate": (device + offload) / queries if queries else None,
        # every prefill token the replicas computed (recomputes after preemption included)
        "prefill_tokens_computed": sum(r.prefill_computed for r in reps),
        "offload_loaded_blocks": offload // pool.spec.block_size,
    }
    if spec is not None:
        out["offload"] = {"capacity_blocks": spec.blocks, "capacity_gib": spec.capacity_gib,
                          "bandwidth_gbs": spec.bandwidth_bytes_s / 1e9,
                          "load_ms_per_block": spec.load_ps_per_block / 1e9,
                          "cost_per_replica_hour": spec.cost_per_hour,
                          "stored_blocks": sum(r.bm.offload.stored_blocks for r in reps if r.bm.offload)}
    return out


def tier_lines(summary: dict) -> list[str]:
    """A terminal line for each pool with an offload tier: hit rates by tier, prompt tokens computed."""
    lines = []
    for name, p in summary["pools"].items():
        t = p.get("kv_tiers") or {}
        o = t.get("offload")
        if o is None or t["hit_rate"] is None:
            continue
        lines.append(f"KV tiers ({name}): {t['hit_rate']:.1%} of prompt tokens looked up found (device "
                     f"{t['device_hit_rate']:.1%}, offload tier {t['offload_hit_rate']:.1%}), "
                     f"{t['prefill_tokens_computed']:,} computed; tier {o['capacity_gib']:.1f} GiB a "
                     f"replica, {o['load_ms_per_block']:.3f} ms to load a block")
    return lines
