"""The server's default limits, exit codes and version, importable without the server's dependencies."""

from __future__ import annotations

# requests queued in the engine (or on their way to it) beyond which new ones get 429 at once:
# a request behind this many others cannot meet a latency SLO, and the autoscaler sees the queue
MAX_WAITING = 1024
# larger than any prompt of a 128k-token context in JSON (as text or token ids), and small enough
# that parsing one body stays well under a second of event-loop time
MAX_REQUEST_BYTES = 4 * 1024 * 1024
DRAIN_TIMEOUT_S = 30.0

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
