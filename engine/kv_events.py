"""KV events out of the engine: `--kv-events-config` (vLLM's JSON), the per-step batch, the ZMQ publisher.

The block manager tells an EventRecorder of each block that becomes findable (BlockStored) or is
evicted (BlockRemoved); the engine loop flushes it once per step into one batch, as vLLM's scheduler
does. The publisher sends (topic, 8-byte big-endian sequence number, msgpack batch) on a PUB socket
(bound when the endpoint has `*`, `::`, ipc:// or inproc://, else connected to a subscriber that
binds, as vLLM decides), keeps the last `buffer_steps` batches, and answers a replay request on the
optional ROUTER socket (the start sequence, 8 bytes big-endian) with every buffered batch from there
on, then an end marker (sequence -1, empty payload); asked for more than the buffer holds, the engine
also publishes a full re-read at its next step (AllBlocksCleared, then every block held). Its first
batch, sequence 0, is AllBlocksCleared, so a subscriber that sees the sequence start again knows the
engine restarted with an empty cache.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.core.kv_events import (
    END_SEQ,
    MEDIUM_DEVICE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    encode_batch,
    seq_bytes,
)

log = logging.getLogger("engine.kv_events")

FLAG = "--kv-events-config"


@dataclass
class KVEventsConfig:
    """vLLM's KVEventsConfig fields and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"  # "zmq" or "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


_TYPES = {"enable_kv_cache_events": bool, "publisher": str, "endpoint": str,
          "replay_endpoint": (str, type(None)), "buffer_steps": int, "hwm": int,
          "max_queue_size": int, "topic": str}


def parse_kv_events_config(text: str | dict[str, Any]) -> KVEventsConfig:
    """A KVEventsConfig from the flag's JSON; ValueError names the flag and the field."""
    if isinstance(text, str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{FLAG} is not valid JSON: {exc}") from None
    else:
        data = text
    if not isinstance(data, dict):
        raise ValueError(f"{FLAG} must be a JSON object, e.g. "
                         '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}')
    for key, value in data.items():
        if key not in _TYPES:
            raise ValueError(f"{FLAG}: unknown field {key!r} (fields: {', '.join(_TYPES)})")
        kind = _TYPES[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{FLAG}: {key} has the wrong type: {value!r}")
    cfg = KVEventsConfig(**data)
    if "publisher" not in data:  # vLLM: zmq when events are on, else null
        cfg.publisher = "zmq" if cfg.enable_kv_cache_events else "null"
    if cfg.publisher not in ("zmq", "null"):
        raise ValueError(f"{FLAG}: publisher must be 'zmq' or 'null', got {cfg.publisher!r}")
    for key in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{FLAG}: {key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("endpoint", "replay_endpoint"):
        value = getattr(cfg, key)
        if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"{FLAG}: {key} must be a ZMQ address (tcp://HOST:PORT, ipc://PATH or "
                             f"inproc://NAME), got {value!r}")
    return cfg


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard or local address is bound, any other is connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class EventRecorder:
    """The block manager's listener: the events of the current step, merged where they chain.

    An offload tier reports only hashes; the recorder keeps each held block's parent and tokens
    (while the device or a tier holds it) so the tier's BlockStored is self-describing, as vLLM's
    offloading connector sends them; one it cannot describe goes as vLLM's placeholder (no tokens,
    block size 0)."""

    def __init__(self, block_size: int, medium: str = MEDIUM_DEVICE):
        self.block_size, self.medium = block_size, medium
        self.pending: list[Event] = []
        self.meta: dict[int, tuple[int | None, list[int]]] = {}  # hash -> (parent, token ids)
        self.copies: dict[int, int] = {}  # hash -> media holding it
        self._gone: list[int] = []  # hashes whose last copy went this step

    def _count(self, hashes, d: int) -> None:
        for h in hashes:
            n = self.copies.get(h, 0) + d
            self.copies[h] = n
            if n <= 0:
                self._gone.append(h)

    def stored(self, hashes: list[int], parent: int | None, token_ids, medium: str | None = None) -> None:
        bs = self.block_size
        for i, h in enumerate(hashes):
            self.meta[h] = (hashes[i - 1] if i else parent, list(token_ids[i * bs:(i + 1) * bs]))
        self._count(hashes, 1)
        self._add_stored(hashes, parent, token_ids, medium or self.medium)

    def tier_stored(self, hashes: list[int], medium: str) -> None:
        """An offload tier took copies of these blocks."""
        self._count(hashes, 1)
        for h in hashes:
            meta = self.meta.get(h)
            if meta is None:
                self.pending.append(BlockStored([h], None, [], 0, medium))
            else:
                self._add_stored([h], meta[0], meta[1], medium)

    def tier_removed(self, hashes: list[int], medium: str) -> None:
        self.removed(hashes, medium)

    def _add_stored(self, hashes: list[int], parent: int | None, token_ids, medium: str) -> None:
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockStored) and last.medium == medium and last.block_hashes[-1] == parent \
                and last.token_ids and token_ids:
            last.block_hashes.extend(hashes)  # the next block of the same prompt
            last.token_ids.extend(token_ids)
            return
        # without tokens (a block landed by KV transfer): vLLM's placeholder, block size 0
        self.pending.append(BlockStored(list(hashes), parent, list(token_ids),
                                        self.block_size if token_ids else 0, medium))

    def removed(self, hashes: list[int], medium: str | None = None) -> None:
        self._count(hashes, -1)
        medium = medium or self.medium
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockRemoved) and last.medium == medium:
            last.block_hashes.extend(hashes)
            return
        self.pending.append(BlockRemoved(list(hashes), medium))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def snapshot(self, bm) -> list[Event]:
        """A full re-read: AllBlocksCleared, then every block the device and the tier hold (parents
        first where known), as a subscriber that lost track needs them."""
        events: list[Event] = [AllBlocksCleared()]
        tier = getattr(bm, "offload", None)
        in_tier = set(tier.index.hashes()) if tier is not None and hasattr(tier, "index") else set()
        held = [h for h in self.meta if h in bm.cached or h in in_tier]
        held += [h for h in list(bm.cached) + list(in_tier) if h not in self.meta]
        for h in dict.fromkeys(held):
            parent, tokens = self.meta.get(h, (None, []))
            size = self.block_size if tokens else 0
            if h in bm.cached:
                events.append(BlockStored([h], parent, list(tokens), size, self.medium))
            if h in in_tier:
                events.append(BlockStored([h], parent, list(tokens), size, tier.medium))
        return events

    def take(self) -> list[Event]:
        for h in self._gone:  # at the step's end: a block evicted to a tier is described first
            if self.copies.get(h, 0) <= 0:
                self.copies.pop(h, None)
                self.meta.pop(h, None)
        self._gone = []
        events, self.pending = self.pending, []
        return events


class ZmqPublisher:
    """PUB socket with a replay buffer; a thread serves replay requests (the sockets stay on it)."""

    def __init__(self, cfg: KVEventsConfig, data_parallel_rank: int = 0):
        import zmq

        self._zmq = zmq
        self.cfg, self.rank = cfg, data_parallel_rank
        self.topic = cfg.topic.encode("utf-8")
        self._ctx = zmq.Context.instance()
        self._queue: deque[EventBatch] = deque()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._wake = threading.Condition()
        self._closed = False
        self._seq = 0
        self.dropped = 0  # batches not queued because the queue was full
        self.snapshot_wanted = False  # set by a replay the buffer could not fill; the engine answers
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._replay = None
        try:
            if binds(cfg.endpoint):
                self._pub.bind(cfg.endpoint)
            else:
                self._pub.connect(cfg.endpoint)
            if cfg.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(cfg.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(f"{FLAG}: cannot open {cfg.endpoint}"
                             f"{' / ' + cfg.replay_endpoint if cfg.replay_endpoint else ''}: {exc}") from None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self.publish([AllBlocksCleared()])  # sequence 0: a fresh, empty cache

    def publish(self, events: list[Event]) -> None:
        with self._wake:
            if len(self._queue) >= self.cfg.max_queue_size:
                self.dropped += 1  # a gap the subscribers will see in the sequence numbers
                self._seq += 1
                return
            self._queue.append((self._seq, EventBatch(time.time(), events, self.rank)))
            self._seq += 1
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._queue and not self._closed:
                    self._wake.wait(0.05)
                items = list(self._queue)
                self._queue.clear()
                closed = self._closed
            # a ZMQ socket handles its pending commands (a subscriber joining) only when its thread
            # touches it: without this, the first batch after a quiet spell goes to no one
            self._pub.getsockopt(self._zmq.EVENTS)
            for seq, batch in items:
                payload = encode_batch(batch)
                self._pub.send_multipart((self.topic, seq_bytes(seq), payload))
                self._buffer.append((seq, payload))
            self._serve_replay()
            if closed:
                break
        self._close_sockets()

    def _serve_replay(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("kv events: a malformed replay request (%d frames) ignored", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart((client, b"", self.topic, seq_bytes(seq), payload))
            self._replay.send_multipart((client, b"", b"", seq_bytes(END_SEQ), b""))
            oldest = self._buffer[0][0] if self._buffer else self._seq
            if start < oldest:  # asked for more than the buffer holds: the engine sends a full re-read
                self.snapshot_wanted = True

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)


class KVEvents:
    """An engine's KV events: the recorder on its block manager and the publisher, flushed after each
    of its steps (engine: an LLMEngine; it holds this as engine.kv_events)."""

    def __init__(self, engine, cfg: KVEventsConfig, medium: str = MEDIUM_DEVICE):
        self.recorder = EventRecorder(engine.block_manager.block_size, medium)
        self.block_manager = engine.block_manager
        self.publisher = ZmqPublisher(cfg)
        engine.block_manager.listener = self.recorder
        tier = engine.block_manager.offload
        if tier is not None:  # its blocks are published under its medium (CPU)
            tier.add_listener(self.recorder.tier_stored, self.recorder.tier_removed)
        engine.kv_events = self

    def flush(self) -> None:
        events = self.recorder.take()
        if self.publisher.snapshot_wanted:  # on the engine's thread, so the cache is consistent
            self.publisher.snapshot_wanted = False
            events = self.recorder.snapshot(self.block_manager)
        if events:
            self.publisher.publish(events)

    def close(self) -> None:
        self.flush()
        self.publisher.close()
