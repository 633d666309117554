"""KV events in: ZMQ SUB sockets, the sequence check, replay or resync, the precise index fed.

Two ways to listen, as vLLM allows both. `connect(key, endpoint, replay_endpoint)` subscribes to one
engine's bound PUB socket; `bind(endpoint)` opens one SUB socket that engines connect to (vLLM with
a non-wildcard endpoint), and each batch's topic names its engine (llm-d's `kv@<pod>@<model>`: the
key is `<pod>`; any other topic is its own key).

Each engine numbers its batches 0, 1, 2, ... A batch numbered past the next one expected means
batches were lost (a slow subscriber past the high-water mark, a publisher queue overflow): with a
replay endpoint the subscriber asks for the missing ones (vLLM's ROUTER protocol: the start number
as 8 bytes big-endian; batches come back, then sequence -1); when the replay cannot fill the gap,
or there is none, it resyncs by forgetting that engine's blocks, since a missed BlockRemoved would
leave the router scoring the engine for blocks it no longer holds. Sequence 0 after others is a
restarted engine: its blocks are forgotten too. Duplicates (seen before) are dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import zmq

from engine.core.kv_events import END_SEQ, DecodeError, EventBatch, decode_batch, read_seq, seq_bytes
from routing.kv_index import KVBlockIndex

log = logging.getLogger("routing.kv_subscriber")

REPLAY_TIMEOUT_S = 1.0
MAX_MESSAGE_BYTES = 64 << 20  # a step's batch is KBs to a few MBs; a larger message drops its sender


def llmd_topic_key(topic: str) -> str:
    """`kv@<pod>@<model>` -> `<pod>`; any other topic is its own key."""
    parts = topic.split("@")
    return parts[1] if len(parts) >= 3 and parts[0] == "kv" else topic


@dataclass
class Stats:
    batches: int = 0
    events: int = 0
    gaps: int = 0  # batches found missing
    replayed: int = 0  # batches recovered by replay
    resyncs: int = 0  # an engine's blocks forgotten (gap not recoverable, or a restart)
    duplicates: int = 0
    bad: int = 0  # messages that were not KV event batches


class KVEventSubscriber:
    def __init__(self, index: KVBlockIndex, key_for_topic: Callable[[str], Hashable] = llmd_topic_key):
        self.index, self.key_for_topic = index, key_for_topic
        self.stats = Stats()
        self.last_seq: dict[Hashable, int] = {}
        self._replays: dict[Hashable, str] = {}
        self._ctx = zmq.Context.instance()
        self._socks: dict[zmq.Socket, tuple[Hashable | None, str | None]] = {}  # sock -> (key, replay)
        self._poller = zmq.Poller()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # sockets are added from the caller's thread

    # -- set-up ----------------------------------------------------------------------------------
    def connect(self, key: Hashable, endpoint: str, replay_endpoint: str | None = None,
                topic: str = "") -> None:
        """Listen to one engine's PUB socket; its batches feed `key`'s blocks."""
        self._add(key, endpoint, replay_endpoint, topic, bind=False)

    def bind(self, endpoint: str, topic: str = "") -> None:
        """Open a SUB socket engines connect to; each batch's topic names its engine."""
        self._add(None, endpoint, None, topic, bind=True)

    def set_replay(self, key: Hashable, replay_endpoint: str) -> None:
        """The replay socket of an engine heard through bind() (its key from its topic)."""
        self._replays[key] = replay_endpoint

    def _add(self, key, endpoint: str, replay: str | None, topic: str, bind: bool) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        try:
            sock.bind(endpoint) if bind else sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            how = "bind" if bind else "connect to"
            raise ValueError(f"KV events: cannot {how} {endpoint}: {exc}") from None
        with self._lock:
            self._socks[sock] = (key, replay)
            self._poller.register(sock, zmq.POLLIN)

    def start(self) -> KVEventSubscriber:
        self._thread = threading.Thread(target=self._run, name="kv-subscriber", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            for sock in self._socks:
                sock.close(linger=0)
            self._socks.clear()

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll(0.1)
            except Exception:  # never let one bad message stop the index being fed
                log.exception("KV event subscriber: a message could not be handled")

    def poll(self, timeout_s: float) -> int:
        """Handle the messages that arrive within timeout_s (the thread's loop; tests call it)."""
        with self._lock:
            ready = dict(self._poller.poll(int(timeout_s * 1000)))
            socks = [(s, self._socks[s]) for s in ready if s in self._socks]
        n = 0
        for sock, (key, replay) in socks:
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames, key, replay)
                n += 1
        return n

    def handle(self, frames: list[bytes], key: Hashable | None = None, replay: str | None = None) -> None:
        """One message: (topic, sequence, payload)."""
        try:
            if len(frames) != 3:
                raise DecodeError(f"a KV event message has 3 frames, got {len(frames)}")
            topic = frames[0].decode("utf-8", "replace")
            seq, batch = read_seq(frames[1]), decode_batch(frames[2])
        except DecodeError as exc:
            self.stats.bad += 1
            if self.stats.bad == 1:
                log.warning("KV events: a message that is not a vLLM event batch skipped: %s", exc)
            return
        if key is None:
            key = self.key_for_topic(topic)
        replay = replay or self._replays.get(key)
        last = self.last_seq.get(key)
        if last is None and seq > 0 and replay:  # joined late: what the engine's buffer still holds
            self._replay(key, replay, 0, seq)
        elif last is not None:
            if seq == 0 and last >= 0:  # the engine restarted: its cache is new
                self.stats.resyncs += 1
                self.index.clear(key)
            elif seq <= last:
                self.stats.duplicates += 1
                return
            elif seq > last + 1:
                self.stats.gaps += seq - last - 1
                if not (replay and self._replay(key, replay, last + 1, seq)):
                    self.stats.resyncs += 1
                    log.warning("KV events of %s: batches %d..%d missed and not replayed; its blocks "
                                "forgotten (resync)", key, last + 1, seq - 1)
                    self.index.clear(key)
        self._apply(key, seq, batch)

    def _apply(self, key: Hashable, seq: int, batch: EventBatch) -> None:
        self.index.apply(key, batch.events)
        self.last_seq[key] = seq
        self.stats.batches += 1
        self.stats.events += len(batch.events)

    def _replay(self, key: Hashable, endpoint: str, start: int, stop: int) -> bool:
        """Ask the engine for batches start..stop-1 and apply them; False when it cannot give them all."""
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        got: list[tuple[int, EventBatch]] = []
        try:
            sock.connect(endpoint)
            sock.send_multipart((b"", seq_bytes(start)))
            while sock.poll(int(REPLAY_TIMEOUT_S * 1000)):
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    return False
                seq = read_seq(frames[2])
                if seq == END_SEQ:
                    break
                if start <= seq < stop:
                    got.append((seq, decode_batch(frames[3])))
                    if len(got) > stop - start:  # more than asked for: not a replay we can trust
                        return False
            else:
                return False  # no end marker in time
        except (zmq.ZMQError, DecodeError) as exc:
            log.warning("KV events of %s: replay from %s failed: %s", key, endpoint, exc)
            return False
        finally:
            sock.close()
        if [s for s, _ in got] != list(range(start, stop)):
            return False  # the engine's buffer no longer holds them all
        for s, batch in got:
            self._apply(key, s, batch)
        self.stats.replayed += len(got)
        return True
