"""vLLM's KV event batches: the three events, and their msgpack encoding, for engines and subscribers.

vLLM 0.32 (vllm/distributed/kv_events.py) sends each batch as three ZMQ frames (topic, an 8-byte
big-endian sequence number, payload); the payload is msgspec's msgpack of `KVEventBatch`, an array
[ts, events, data_parallel_rank], each event a map tagged by "type" with its fields in declaration
order and defaulted ones left out. Older vLLM releases sent each event as an array, the tag first
(["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, ...]); decode takes both.
Block hashes are ints (vLLM's default: the low 64 bits of its sha256) or bytes; ours are the engine
block manager's own chained hash (engine.core.block_hash), a signed 64-bit int.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import msgpack

MEDIUM_DEVICE = "GPU"  # vLLM's name for the accelerator's own KV pool (also on a CPU build)
MEDIUM_CPU = "CPU"  # vLLM's host-memory offload tier
SEQ_BYTES = 8
END_SEQ = -1  # the replay socket's end-of-replay marker

BlockHash = Union[int, bytes]


@dataclass
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None  # None: the first block of a prompt
    token_ids: list[int]  # len(block_hashes) * block_size tokens
    block_size: int
    medium: str | None = MEDIUM_DEVICE
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = MEDIUM_DEVICE


@dataclass
class AllBlocksCleared:
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass
class EventBatch:
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class DecodeError(ValueError):
    """A payload that is not a vLLM KV event batch."""


def _event_map(e: Event) -> dict:
    if isinstance(e, BlockStored):  # vLLM's field order; its defaulted fields are omitted
        return {"type": "BlockStored", "block_hashes": e.block_hashes,
                "parent_block_hash": e.parent_block_hash, "token_ids": e.token_ids,
                "block_size": e.block_size, "lora_id": e.lora_id,
                "medium": e.medium, "lora_name": e.lora_name}
    if isinstance(e, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": e.block_hashes, "medium": e.medium}
    return {"type": "AllBlocksCleared"}


def encode_batch(batch: EventBatch) -> bytes:
    return msgpack.packb([batch.ts, [_event_map(e) for e in batch.events], batch.data_parallel_rank],
                         use_bin_type=True)


_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
_REMOVED = ("block_hashes", "medium")


def _hashes(value, what: str) -> list[BlockHash]:
    if not isinstance(value, list) or not all(isinstance(h, (int, bytes)) and not isinstance(h, bool)
                                              for h in value):
        raise DecodeError(f"{what}.block_hashes must be a list of ints or bytes")
    return value


def _event(raw) -> Event:
    if isinstance(raw, (list, tuple)):  # the array form: the tag, then the fields in order
        if not raw or not isinstance(raw[0], str):
            raise DecodeError("an array event must start with its type name")
        names = {"BlockStored": _STORED, "BlockRemoved": _REMOVED, "AllBlocksCleared": ()}.get(raw[0])
        if names is None:
            raise DecodeError(f"unknown KV event type {raw[0]!r}")
        raw = {"type": raw[0], **dict(zip(names, raw[1:]))}
    if not isinstance(raw, dict):
        raise DecodeError(f"a KV event must be a map or an array, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind == "BlockStored":
        tokens, size = raw.get("token_ids"), raw.get("block_size")
        if not isinstance(size, int) or size < 0:  # 0: vLLM's offload placeholder (no tokens)
            raise DecodeError(f"BlockStored.block_size must be an integer >= 0, got {size!r}")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise DecodeError("BlockStored.token_ids must be a list of ints")
        parent = raw.get("parent_block_hash")
        if parent is not None and not isinstance(parent, (int, bytes)):
            raise DecodeError("BlockStored.parent_block_hash must be an int, bytes or nil")
        return BlockStored(_hashes(raw.get("block_hashes"), kind), parent, tokens, size, raw.get("medium"),
                           raw.get("lora_id"), raw.get("lora_name"))
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(raw.get("block_hashes"), kind), raw.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise DecodeError(f"unknown KV event type {kind!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """An EventBatch from a payload frame; DecodeError (a ValueError) names what is wrong."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for truncated or invalid data
        raise DecodeError(f"not msgpack: {exc}") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[0], (int, float)) \
            or not isinstance(raw[1], (list, tuple)):
        raise DecodeError("a KV event batch must be an array [ts, events, data_parallel_rank]")
    rank = raw[2] if len(raw) > 2 else None
    return EventBatch(float(raw[0]), [_event(e) for e in raw[1]], rank)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big", signed=seq < 0)


def read_seq(frame: bytes) -> int:
    """A sequence frame's number (vLLM writes it unsigned; its end-of-replay marker is -1 signed)."""
    if len(frame) != SEQ_BYTES:
        raise DecodeError(f"a sequence frame has {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)
