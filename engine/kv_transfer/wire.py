"""The engines' own KV channel: length-prefixed msgpack frames over a socket, and the handshake.

A frame is 4 bytes of header length, the msgpack header, then `nbytes` (from the header) of raw
payload. The consumer opens with a `hello` naming its KV layout; the producer refuses a layout that
differs (block size, dtype, layers, KV heads, head size) with the reason, before any block moves.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

MAX_HEADER = 1 << 20
LAYOUT_KEYS = ("block_size", "dtype", "num_layers", "num_kv_heads", "head_dim")


class KVTransferError(RuntimeError):
    """The transfer failed: the channel broke or the peer refused."""


class KVLayoutMismatch(KVTransferError):
    """The two engines' KV layouts differ: no block can be moved between them."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    head = msgpack.packb({**header, "nbytes": len(payload)})
    sock.sendall(struct.pack("!I", len(head)) + head)
    if payload:
        sock.sendall(payload)


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
