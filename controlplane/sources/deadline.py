"""A deadline for a whole HTTP exchange, not for each read.

requests' and httpx's timeouts bound each socket operation, so a server that sends one byte every
second never trips them: a Prometheus dripping its answer held a reconcile for minutes. Go's
http.Client.Timeout, which KEDA uses, covers the whole exchange; this gives the same: the call runs
in a daemon thread and the caller stops waiting at the deadline (the thread ends when the server
does; the caller drops the client it used, so nothing else shares its connection meanwhile).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """No complete answer within the deadline."""


def call_with_deadline(fn: Callable[[], T], seconds: float, name: str = "query") -> T:
    """fn()'s result or exception, or DeadlineExceeded once `seconds` have passed."""
    box: list = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller as is
            box.append((False, exc))
        done.set()

    threading.Thread(target=run, name=f"deadline-{name}", daemon=True).start()
    if not done.wait(seconds):
        raise DeadlineExceeded(f"no complete answer within {seconds:g}s")
    ok, value = box[0]
    if ok:
        return value
    raise value
