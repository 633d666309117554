"""The producer side: leases on a finished prefill's KV blocks, and the channel that serves them.

Block references are taken and dropped only on the engine thread (lease(), tick()); the channel's
threads read leased blocks (nobody writes a full, referenced block) and mark leases read. A lease
ends when its consumer confirms the read, or at the lease timeout if no consumer ever comes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.block_hash import block_hashes
from engine.core.sequence import Sequence
from engine.kv_transfer import wire
from engine.kv_transfer.blocks import gather
from engine.kv_transfer.config import KVTransferConfig

log = logging.getLogger("slopilot.kv_transfer")


@dataclass
class Lease:
    blocks: list[int]
    expiry: float
    reading: int = 0  # channel threads copying its blocks now
    done: bool = False  # confirmed by the consumer


class KVProducer:
    def __init__(self, cfg: KVTransferConfig, engine, layout: dict[str, Any], wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic):
        self.cfg, self.engine, self.layout, self.wake, self.clock = cfg, engine, layout, wake, clock
        self.leases: dict[str, Lease] = {}
        self.lock = threading.Lock()
        self.num_expired = 0
        self.bytes_sent = 0
        self.sock = socket.create_server((cfg.kv_ip, cfg.kv_port))
        self.port = self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="kv-producer", daemon=True).start()

    # -- engine thread ---------------------------------------------------------------------------
    def lease(self, seq: Sequence) -> dict[str, Any]:
        """Holds the finished prefill's full prompt blocks; the kv_transfer_params to answer with."""
        bm = self.engine.block_manager
        n = (seq.num_prompt_tokens - 1) // bm.block_size  # as many as a consumer's prefix lookup can use
        hashes = list(block_hashes(seq.token_ids[:seq.num_prompt_tokens], bm.block_size, 0, n))
        blocks = bm.hold_cached(hashes)
        with self.lock:
            self.leases[seq.request_id] = Lease(blocks, self.clock() + self.cfg.lease_timeout_s)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.cfg.engine_id,
                "remote_request_id": seq.request_id, "remote_block_ids": blocks,
                "remote_host": self.cfg.kv_ip, "remote_port": self.port, "tp_size": 1,
                "remote_num_tokens": len(blocks) * bm.block_size,
                "remote_prefix_hash": hashes[len(blocks) - 1] if blocks else None, **self.layout}

    def tick(self) -> int:
        """Drops the references of confirmed and expired leases; how many blocks it freed."""
        now, ended = self.clock(), []
        with self.lock:
            for rid, lease in list(self.leases.items()):
                if lease.done or (now >= lease.expiry and lease.reading == 0):
                    if not lease.done:
                        self.num_expired += 1
                        log.info("KV lease of %s expired unread after %.1f s", rid, self.cfg.lease_timeout_s)
                    ended.append(self.leases.pop(rid))
        for lease in ended:
            self.engine.block_manager.release(lease.blocks)
        return sum(len(lease.blocks) for lease in ended)

    @property
    def num_leased_blocks(self) -> int:
        with self.lock:
            return sum(len(lease.blocks) for lease in self.leases.values())

    def close(self) -> None:
        self._closed = True
        try:  # wakes the accept() of the channel thread (close alone leaves it listening on Linux)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # -- channel threads -------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="kv-producer-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                hello, _ = wire.recv(conn)
                problem = wire.layout_mismatch(self.layout, hello.get("layout") or {})
                if hello.get("op") != "hello":
                    problem = "the KV channel must open with hello"
                wire.send(conn, {"op": "error", "message": problem} if problem else
                          {"op": "ok", "engine_id": self.cfg.engine_id})
                if problem:
                    return
                while True:
                    msg, _ = wire.recv(conn)
                    self._handle(conn, msg)
            except wire.KVTransferError:
                return  # the consumer hung up; its lease ends by confirmation or timeout
            except OSError as exc:
                log.info("KV channel connection ended: %s", exc)

    def _handle(self, conn: socket.socket, msg: dict[str, Any]) -> None:
        rid, op = str(msg.get("request_id")), msg.get("op")
        with self.lock:
            lease = self.leases.get(rid)
            if lease is not None and op == "read":
                lease.reading += 1
            elif lease is not None and op == "done":
                lease.done = True
        if op == "done":
            wire.send(conn, {"op": "ok"})
            self.wake()
            return
        if op != "read" or lease is None or lease.done:
            wire.send(conn, {"op": "error", "message": f"no KV lease for request {rid!r} (unknown, read "
                                                       "already or expired)"})
            return
        try:
            want = [int(b) for b in msg.get("block_ids", [])]
            if not set(want) <= set(lease.blocks):
                wire.send(conn, {"op": "error", "message": "asked for blocks outside the lease"})
                return
            caches = getattr(self.engine.runner, "kv_caches", None)
            payload = gather(caches, want) if caches is not None else b""  # emulated: time, not bytes
        finally:
            with self.lock:
                lease.reading -= 1
        self.bytes_sent += len(payload)
        wire.send(conn, {"op": "data", "num_blocks": len(want)}, payload, self.cfg.send_bytes_per_s)
