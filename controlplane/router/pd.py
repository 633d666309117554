"""The P/D scheduling profile: a prefill hop before the decode hop, in vLLM's kv_transfer_params protocol.

As llm-d's pd-profile-handler decides: a request whose prompt has more uncached tokens than the
threshold is disaggregated, else it goes whole to a decode endpoint. Uncached tokens: the prompt's
tokens less the longest prefix the router has already sent to one decode endpoint (its prefix index,
when a prefix scorer is on; otherwise the whole prompt counts as uncached).

The prefill hop sends the request to a prefill endpoint with `max_tokens: 1`, no streaming and
`kv_transfer_params: {"do_remote_decode": true}`; its answer's `kv_transfer_params` go into the
original body for the decode hop (the regular forward: streaming, retries, metrics). A prefill
endpoint that fails before answering (refused, 5xx, timeout) is skipped for a moment and the next one
is tried; a 4xx is the client's and is passed back; with none left the client gets a 503.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.pool import base_url
from controlplane.router.upstream import Upstream, UpstreamError

DOWN_SECONDS = 2.0  # a prefill endpoint that failed gets nothing new for this long
MAX_ANSWER = 1 << 20  # a 1-token answer is small


@dataclass
class PDSettings:
    prefill: list[str]  # the prefill endpoints' base URLs (the router's own endpoints decode)
    threshold: int = 0  # disaggregate when the prompt's uncached tokens exceed this
    timeout: float = 600.0  # the prefill hop's whole answer

    def __post_init__(self) -> None:
        if not self.prefill:
            raise ValueError("the P/D profile needs at least one prefill endpoint (--prefill-endpoint)")
        if self.threshold < 0:
            raise ValueError(f"--pd-threshold must be >= 0, got {self.threshold}")


@dataclass
class PrefillHop:
    settings: PDSettings
    registry: CollectorRegistry
    outstanding: dict[str, int] = field(default_factory=dict)
    down_until: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.urls = [base_url(u) for u in self.settings.prefill]
        self.outstanding = {u: 0 for u in self.urls}
        self.decisions = Counter("slopilot_router_pd_decisions", "P/D profile decisions (disaggregated: a "
                                 "prefill hop first; aggregated: the decode endpoint does it all)",
                                 ["decision"], registry=self.registry)
        self.hop_seconds = Histogram("slopilot_router_prefill_hop_seconds", "The prefill hop, sent to "
                                     "answered", ["endpoint"], registry=self.registry)
        self.failures = Counter("slopilot_router_prefill_hop_failures", "Prefill hops that failed before "
                                "answering", ["endpoint", "reason"], registry=self.registry)

    def uncached_tokens(self, gate: Gate, p: Pending) -> int:
        index = gate.router.index
        if index is None or not p.hashes:
            return p.tokens
        hit = max((index.match(ep.id, p.hashes) for ep in gate.pool.routable()), default=0)
        return max(p.tokens - hit * gate.router.block_tokens, 0)

    def decide(self, gate: Gate, p: Pending) -> bool:
        """True: disaggregate this request (call before the decode pick records its prefix)."""
        split = self.uncached_tokens(gate, p) > self.settings.threshold
        self.decisions.labels("disaggregated" if split else "aggregated").inc()
        return split

    def _candidates(self) -> list[str]:
        now = time.monotonic()
        up = [u for u in self.urls if self.down_until.get(u, 0.0) <= now]
        return sorted(up, key=lambda u: self.outstanding[u])

    async def run(self, client: Upstream, path: str, data: dict, headers: bytes) -> bytes:
        """The decode hop's body: the original request with the prefill's kv_transfer_params."""
        hop = {**data, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        hop.pop("stream_options", None)
        if "max_completion_tokens" in hop:
            hop["max_completion_tokens"] = 1
        body, last = json.dumps(hop).encode(), "no prefill endpoint is ready"
        for url in self._candidates():
            self.outstanding[url] += 1
            t0 = time.monotonic()
            try:
                resp = await client.request(url, b"POST", path, headers, body, timeout=self.settings.timeout)
                try:
                    answer = await resp.read_all(MAX_ANSWER)
                finally:
                    resp.close()
            except UpstreamError as exc:
                last = self._failed(url, "refused" if exc.refused else "lost", f"{url}: {exc}")
                continue
            finally:
                self.outstanding[url] -= 1
            if resp.status == 200:
                kv = _kv_params(answer)
                if kv is None:
                    last = self._failed(url, "no_params", f"{url}: answered without kv_transfer_params "
                                                          "(is it started with a kv_producer role?)")
                    continue
                self.hop_seconds.labels(url).observe(time.monotonic() - t0)
                return json.dumps({**data, "kv_transfer_params": kv}).encode()
            if 400 <= resp.status < 500 and resp.status != 429:
                raise Refused(resp.status, _message(answer, resp.status), "BadRequestError")
            last = self._failed(url, str(resp.status), f"{url}: HTTP {resp.status}")
        raise Refused(503, f"no prefill endpoint could take the request ({last})", "ServiceUnavailableError")

    def _failed(self, url: str, reason: str, why: str) -> str:
        self.failures.labels(url, reason).inc()
        self.down_until[url] = time.monotonic() + DOWN_SECONDS
        return why


def _kv_params(answer: bytes) -> dict | None:
    try:
        kv = json.loads(answer).get("kv_transfer_params")
    except (ValueError, AttributeError):
        return None
    return kv if isinstance(kv, dict) and kv.get("do_remote_prefill") else None


def _message(answer: bytes, status: int) -> str:
    try:
        return f"prefill hop: {json.loads(answer)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"prefill hop: HTTP {status}"
