"""The server's default limits, exit codes and version, importable without the server's dependencies."""

from __future__ import annotations

# requests queued in the engine (or on their way to it) beyond which new ones get 429 at once: a
# request behind this many others (4 full batches at the default --max-num-seqs) cannot meet a
# latency SLO anyway, the autoscaler still sees the queue, and the live heap stays small enough
# for a full garbage collection to pause the server for tens of milliseconds, not hundreds
MAX_WAITING = 256
# larger than any prompt of a 128k-token context in JSON (as text or token ids), and small enough
# that parsing one body stays well under a second of event-loop time
MAX_REQUEST_BYTES = 4 * 1024 * 1024
DRAIN_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 30.0  # a request body must arrive within this (else 408)

# serve()'s exit codes besides 0 (every request finished); 2 is the CLI's for bad options
EXIT_ENGINE_DIED = 1  # the engine loop died, or the server could not start
EXIT_DRAIN_INCOMPLETE = 3  # the drain timeout ended requests still running (each got a 503)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    try:
        return pkg_version("slopilot")
    except PackageNotFoundError:
        return "0.1.0"
