"""The consumer side: pull a prefill's KV blocks from its producer, land them, then admit the request.

On the engine thread, begin() finds how much of the prompt's full-block prefix is cached here
already (those blocks are not moved), takes blocks for the rest and starts a pull in a thread.
When the pull is back, finish() (engine thread again) writes the bytes into those blocks, registers
them in the prefix cache, drops its references and queues the request: admission then finds the
prompt's prefix cached and computes only the tail. A pull that fails for any reason but a layout
mismatch falls back to computing the prompt here; a mismatch fails the request with the reason.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.block_hash import block_hashes
from engine.kv_transfer import wire
from engine.kv_transfer.blocks import scatter

log = logging.getLogger("slopilot.kv_transfer")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0


@dataclass
class Pull:
    request_id: str
    hashes: list[int]  # of the blocks to land, in order
    blocks: list[int]  # landing blocks here, referenced until finish()
    args: tuple  # engine.add_request's arguments once the blocks are in
    started: float = field(default_factory=time.perf_counter)
    aborted: bool = False


def fetch(host: str, port: int, layout: dict[str, Any], remote_request_id: str,
          block_ids: list[int]) -> bytearray:
    """Reads these blocks of the lease, then confirms so the producer frees them."""
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
        sock.settimeout(READ_TIMEOUT_S)
        wire.send(sock, {"op": "hello", "layout": layout})
        reply, _ = wire.recv(sock)
        if reply.get("op") != "ok":
            raise wire.KVLayoutMismatch(str(reply.get("message")))
        payload = bytearray()
        if block_ids:
            wire.send(sock, {"op": "read", "request_id": remote_request_id, "block_ids": block_ids})
            reply, payload = wire.recv(sock)
            if reply.get("op") != "data":
                raise wire.KVTransferError(str(reply.get("message")))
        wire.send(sock, {"op": "done", "request_id": remote_request_id})
        wire.recv(sock)
        return payload


def remote_params(params: dict[str, Any]) -> tuple[str, int, str, list[int]]:
    """(host, port, remote request id, block ids) of a do_remote_prefill request; ValueError if malformed."""
    host, port, rid, ids = (params.get(k) for k in ("remote_host", "remote_port", "remote_request_id",
                                                    "remote_block_ids"))
    if not isinstance(host, str) or not isinstance(port, int) or rid is None:
        raise ValueError("kv_transfer_params with do_remote_prefill need remote_host (string), "
                         "remote_port (integer) and remote_request_id")
    if not isinstance(ids, list) or not all(isinstance(b, int) for b in ids):
        raise ValueError("kv_transfer_params.remote_block_ids must be a list of integers")
    return host, port, str(rid), ids


class KVConsumer:
    def __init__(self, engine, layout: dict[str, Any], wake: Callable[[], None], emulated=None):
        """emulated: the KVTransferConfig of an emulated engine (a pull sleeps its modelled time)."""
        self.engine, self.layout, self.wake, self.emulated = engine, layout, wake, emulated
        self.pulls: dict[str, Pull] = {}
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (request id, payload or exception)
        self.bytes_received = 0
        self.blocks_received = 0
        self.num_failed = 0  # pulls that fell back to computing the prompt here
        self.transfers: list[tuple[float, int]] = []  # (seconds, bytes) of each pull, for the metrics

    def begin(self, request_id: str, prompt_ids: list[int], params: dict[str, Any], args: tuple) -> None:
        """Starts the pull of a do_remote_prefill request (engine thread)."""
        host, port, rid, remote_blocks = remote_params(params)
        bm = self.engine.block_manager
        m = min(len(remote_blocks), (len(prompt_ids) - 1) // bm.block_size)
        hashes = list(block_hashes(prompt_ids, bm.block_size, 0, m))
        if m and params.get("remote_prefix_hash") not in (None, hashes[-1]):
            m = 0  # the producer prefilled another prompt (other tokens): move nothing, compute here
        local = 0
        while local < m and hashes[local] in bm.cached:
            local += 1  # already cached here: not moved
        blocks = bm.allocate_blocks(m - local) or []
        if len(blocks) < m - local:
            local = m  # no room to land them now: compute here
        pull = Pull(request_id, hashes[local:m], blocks, args)
        self.pulls[request_id] = pull
        want = remote_blocks[local:m] if blocks else []

        def run() -> None:
            try:
                result: Any = fetch(host, port, self.layout, rid, want)
                if self.emulated is not None:
                    time.sleep(self.emulated.transfer_seconds(len(want) * bm.block_size))
            except Exception as exc:  # noqa: BLE001 - every failure is reported to the engine thread
                result = exc
            self.done.put((request_id, result))
            self.wake()

        threading.Thread(target=run, name="kv-pull", daemon=True).start()

    def abort(self, request_id: str) -> bool:
        pull = self.pulls.get(request_id)
        if pull is not None:
            pull.aborted = True
        return pull is not None

    def finish(self) -> list[tuple[Pull, str | None]]:
        """Lands the pulls that came back (engine thread): [(pull, error for the client or None)];
        a pull with no error is ready to be queued with pull.args."""
        out = []
        bm = self.engine.block_manager
        while True:
            try:
                request_id, result = self.done.get_nowait()
            except queue.Empty:
                return out
            pull = self.pulls.pop(request_id)
            error = None
            if isinstance(result, wire.KVLayoutMismatch):
                error = f"KV transfer refused at the handshake: {result}"
            elif isinstance(result, Exception):
                self.num_failed += 1
                log.warning("KV pull for %s failed, computing the prompt here: %s", request_id, result)
            elif not pull.aborted:
                try:
                    if self.emulated is None:
                        scatter(self.engine.runner.kv_caches, pull.blocks, result)
                except ValueError as exc:
                    self.num_failed += 1
                    log.warning("KV pull for %s unusable, computing the prompt here: %s", request_id, exc)
                else:
                    for block, h in zip(pull.blocks, pull.hashes):
                        bm.register(block, h)
                    nbytes = len(result) if self.emulated is None else \
                        int(len(pull.blocks) * bm.block_size * self.emulated.kv_bytes_per_token)
                    self.bytes_received += nbytes
                    self.blocks_received += len(pull.blocks)
                    self.transfers.append((time.perf_counter() - pull.started, nbytes))
            bm.release(pull.blocks)  # registered blocks stay cached (evictable) until admission
            if not pull.aborted:
                out.append((pull, error))
