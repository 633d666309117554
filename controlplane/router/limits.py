"""The limits of the router's HTTP server, as a proxy in front of engines is expected to have them.

Defaults in the range of Envoy's and nginx's: the request head (request line and headers) must
arrive within `header_timeout` of its first byte (or of the connection's start), the body within
`body_timeout` of the head, and an idle keep-alive connection is closed after `idle_timeout`. A URL
over `max_url_bytes` gets 414 and a head over `max_head_bytes` 431, both before the parser has
buffered more than that (its cost grows faster than the header). Client connections are capped
below the descriptor limit, which is raised to its hard limit at start: past the cap a new
connection gets a 503 and is closed, so engine connections and scrapes always find a descriptor.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger("slopilot.router")

RESERVED_FDS = 256  # for engine connections beyond one per client, scrapes, logs, the listener


@dataclass(frozen=True)
class ServerLimits:
    header_timeout: float = 10.0  # nginx client_header_timeout 60 s; Envoy's guidance 10 s
    body_timeout: float = 60.0  # for the whole body (a 4 MiB body at 70 KB/s)
    idle_timeout: float = 60.0  # nginx keepalive_timeout 75 s
    max_url_bytes: int = 8192  # nginx large_client_header_buffers 8k
    max_head_bytes: int = 64 * 1024  # Envoy max_request_headers_kb 60
    max_headers: int = 100  # Envoy's default header count
    max_connections: int = 10_000  # further capped by the descriptor limit (connection_cap)


def raise_nofile() -> int:
    """Raises the soft descriptor limit to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(limits: ServerLimits, nofile: int) -> int:
    """Client connections allowed at once: each may hold one engine connection too."""
    return max(1, min(limits.max_connections, (nofile - RESERVED_FDS) // 2))
