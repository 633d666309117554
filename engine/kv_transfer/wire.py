"""The engines' own KV channel: length-prefixed msgpack frames over a socket, and the handshake.

A frame is 4 bytes of header length, the msgpack header, then `nbytes` (from the header) of raw
payload. The consumer opens with a `hello` naming its KV layout; the producer refuses a layout that
differs (block size, dtype, layers, KV heads, head size) with the reason, before any block moves.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import msgpack

MAX_HEADER = 1 << 20
PACE_CHUNK = 64 << 10  # a paced payload goes out in pieces this big
LAYOUT_KEYS = ("block_size", "dtype", "num_layers", "num_kv_heads", "head_dim")


class KVTransferError(RuntimeError):
    """The transfer failed: the channel broke or the peer refused."""


class KVLayoutMismatch(KVTransferError):
    """The two engines' KV layouts differ: no block can be moved between them."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"",
         bytes_per_s: float | None = None) -> None:
    """bytes_per_s: pace the payload to this rate (a slower link than loopback), chunk by chunk."""
    head = msgpack.packb({**header, "nbytes": len(payload)})
    sock.sendall(struct.pack("!I", len(head)) + head)
    if payload and not bytes_per_s:
        sock.sendall(payload)
    elif payload:
        view, t0 = memoryview(payload), time.monotonic()
        for i in range(0, len(view), PACE_CHUNK):
            sock.sendall(view[i:i + PACE_CHUNK])
            ahead = t0 + min(i + PACE_CHUNK, len(view)) / bytes_per_s - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def _read_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise KVTransferError(f"the peer closed the KV channel ({got} of {n} bytes read)")
        got += k
    return buf


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    (size,) = struct.unpack("!I", _read_exact(sock, 4))
    if size > MAX_HEADER:
        raise KVTransferError(f"KV channel header of {size} bytes is over the {MAX_HEADER} limit")
    header = msgpack.unpackb(bytes(_read_exact(sock, size)))
    if not isinstance(header, dict):
        raise KVTransferError("KV channel header is not a map")
    return header, _read_exact(sock, int(header.get("nbytes", 0)))


def layout_mismatch(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why two KV layouts cannot exchange blocks, or None when they match."""
    keys = list(LAYOUT_KEYS) + sorted((set(mine) | set(theirs)) - set(LAYOUT_KEYS))
    diffs = [f"{k} {theirs.get(k)!r} (consumer) vs {mine.get(k)!r} (producer)"
             for k in keys if mine.get(k) != theirs.get(k)]
    return "KV layout mismatch: " + "; ".join(diffs) if diffs else None
