"""The P/D scheduling profile: a prefill hop before the decode hop, in vLLM's kv_transfer_params protocol.

As llm-d's pd-profile-handler decides: a request whose prompt has more uncached tokens than the
threshold is disaggregated, else it goes whole to a decode endpoint. Uncached tokens: the prompt's
tokens less the longest prefix the router has already sent to one decode endpoint (its prefix index,
when a prefix scorer is on; otherwise the whole prompt counts as uncached).

The prefill hop sends the request to a prefill endpoint with `max_tokens: 1`, no streaming and
`kv_transfer_params: {"do_remote_decode": true}`; its answer's `kv_transfer_params` go into the
original body for the decode hop (the regular forward: streaming, retries, metrics). With
`shared_kv` the engines meet through storage keyed by the prompt's tokens (vLLM's ExampleConnector,
LMCache): the prefill answer carries no parameters and the decode hop gets the original body; the
consumer finds the prompt's KV by itself.

The prefill endpoints are a pool of their own with the decode pool's machinery (controlplane.router.pool:
discovery every refresh, so a scaled prefill fleet is followed; /metrics scrapes; ejection on failures
and /health checks to readmit) and a picker of their own with the router config's policy and scorers
(queue, KV, prefix: a prompt whose prefix one prefill engine has cached goes back there). A prefill
endpoint that fails before answering (refused, 5xx, timeout) is counted against its health (a refusal
ejects it at once) and the next one is tried; a 4xx is the client's and is passed back; with none
left the client gets a 503.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from controlplane.router.answer import UpstreamError
from controlplane.router.endpoints import Endpoint
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pool import Pool
from controlplane.router.upstream import Upstream
from routing.config import RouterConfig, build_router

MAX_ANSWER = 1 << 20  # a 1-token answer is small


@dataclass
class PDSettings:
    # the prefill endpoints' base URLs, or a callable returning them now (a scaled fleet's); the
    # router's own endpoints decode
    prefill: list[str] | Callable[[], list[str]]
    threshold: int = 0  # disaggregate when the prompt's uncached tokens exceed this
    timeout: float = 600.0  # the prefill hop's whole answer
    # the KV meets in storage keyed by the prompt: an answer without kv_transfer_params is the norm
    shared_kv: bool = False

    def __post_init__(self) -> None:
        if not callable(self.prefill) and not self.prefill:
            raise ValueError("the P/D profile needs at least one prefill endpoint (--prefill-endpoint)")
        if self.threshold < 0:
            raise ValueError(f"--pd-threshold must be >= 0, got {self.threshold}")

    def discover(self) -> Callable[[], list[str]]:
        if callable(self.prefill):
            return self.prefill
        fixed = list(self.prefill)
        return lambda: fixed


class PrefillHop:
    def __init__(self, settings: PDSettings, cfg: RouterConfig, metrics: RouterMetrics):
        self.settings, self.metrics = settings, metrics
        registry = metrics.registry
        self.pool = Pool(cfg, settings.discover(), metrics, name=f"{metrics.pool}-prefill")
        # the decode picker's policy and scorers, with an index of its own (endpoint ids are per pool)
        self.router = build_router(cfg)
        self.decisions = Counter("slopilot_router_pd_decisions", "P/D profile decisions (disaggregated: a "
                                 "prefill hop first; aggregated: the decode endpoint does it all)",
                                 ["decision"], registry=registry)
        self.hop_seconds = Histogram("slopilot_router_prefill_hop_seconds", "The prefill hop, sent to "
                                     "answered", ["endpoint"], registry=registry)
        self.failures = Counter("slopilot_router_prefill_hop_failures", "Prefill hops that failed before "
                                "answering", ["endpoint", "reason"], registry=registry)

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

    def pick(self, p: Pending, tried: set[str]) -> Endpoint | None:
        """A healthy prefill endpoint not yet tried for this request, by the scorers (None: none)."""
        now = time.monotonic()
        room = [e for e in self.pool.routable()
                if e.url not in tried and e.busy_until <= now and e.serves(p.model)]
        if not room:
            return None
        return room[self.router.pick(room, hashes=p.hashes, session=p.session)]

    async def run(self, client: Upstream, path: str, data: dict, headers: bytes, p: Pending) -> bytes:
        """The decode hop's body: the original request with the prefill's kv_transfer_params."""
        hop = {**data, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        hop.pop("stream_options", None)
        if "max_completion_tokens" in hop:
            hop["max_completion_tokens"] = 1
        body, last, tried = json.dumps(hop).encode(), "no prefill endpoint is ready", set()
        while (ep := self.pick(p, tried)) is not None:
            tried.add(ep.url)
            ep.outstanding += 1
            ep.in_flight_tokens += p.tokens
            ep.served += 1
            t0 = time.monotonic()
            try:
                resp = await client.request(ep.url, b"POST", path, headers, body,
                                            timeout=self.settings.timeout)
                try:
                    answer = await resp.read_all(MAX_ANSWER)
                finally:
                    resp.close()
            except UpstreamError as exc:
                last = self._failed(ep, "refused" if exc.refused else "lost", f"{ep.url}: {exc}", exc.refused)
                continue
            finally:
                self._release(ep, p)
            if resp.status == 200:
                kv = _kv_params(answer)
                if kv is None and not self.settings.shared_kv:
                    last = self._failed(ep, "no_params", f"{ep.url}: answered without kv_transfer_params "
                                                         "(is it started with a kv_producer role? "
                                                         "A connector sharing KV through storage needs "
                                                         "--pd-shared-kv)")
                    continue
                self.pool.succeeded(ep)
                self.hop_seconds.labels(ep.url).observe(time.monotonic() - t0)
                return json.dumps({**data, "kv_transfer_params": kv} if kv else data).encode()
            if resp.status == 429:  # full: no new work for a moment, not a health failure
                ep.busy_until = time.monotonic() + 1.0
                self.failures.labels(ep.url, "429").inc()
                last = f"{ep.url}: HTTP 429"
                continue
            if 400 <= resp.status < 500:
                raise Refused(resp.status, _message(answer, resp.status), "BadRequestError")
            last = self._failed(ep, str(resp.status), f"{ep.url}: HTTP {resp.status}")
        raise Refused(503, f"no prefill endpoint could take the request ({last})", "ServiceUnavailableError")

    def _release(self, ep: Endpoint, p: Pending) -> None:
        ep.outstanding -= 1
        ep.in_flight_tokens -= p.tokens
        if ep.draining and ep.outstanding == 0:
            self.pool.sync([u for u, e in self.pool.endpoints.items() if not e.draining])

    def _failed(self, ep: Endpoint, reason: str, why: str, refused: bool = False) -> str:
        self.failures.labels(ep.url, reason).inc()
        self.pool.failed(ep, why, refused=refused)
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
