"""Admission at the gateway: the shared flow control (routing.flow) and picker (routing.router)
on the live pool, in the event loop.

A request is offered to its priority band (full: 429), then waits for `pump` to dispatch it: the
highest band first, to an endpoint with room by the saturation detector, chosen by filter-score-pick.
Without flowControl in the config the detector never calls an endpoint saturated, so requests wait
only while there is no endpoint at all (scaled to zero), up to their band's TTL (then 503).
A request goes only to endpoints serving its model (the model_name of their metrics); one for a
model no endpoint serves is answered 404 at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.router.endpoints import Endpoint
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pool import Pool
from routing.config import RouterConfig, build_router
from routing.flow import GatewayQueue, Held, SaturationDetector, pump

UNGATED = SaturationDetector(queue_threshold=2**31 - 1, kv_threshold=1.0)


class Refused(Exception):
    """The gateway answers this request itself (429 band full, 503 past its TTL or no endpoint)."""

    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class Pending:
    hashes: list[int]
    tokens: int
    session: str | None
    priority: int
    model: str
    arrived: float
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    endpoint: Endpoint | None = None


class Gate:
    def __init__(self, cfg: RouterConfig, pool: Pool, metrics: RouterMetrics,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg, self.pool, self.metrics, self.clock = cfg, pool, metrics, clock
        self.router = build_router(cfg)
        self.queue = GatewayQueue(cfg.bands)
        self.detector = cfg.detector() if cfg.flow_control else UNGATED
        pool.on_change = self.refreshed
        self._sizes_set: dict[str, int] = {}  # the queue-size gauges' values (set only when they change)
        for b in self.queue.bands:
            metrics.queue_size.labels(b.label, metrics.pool).set(0)
            self._sizes_set[b.label] = 0

    def priority(self, objective: str | None, model: str, explicit: str | None) -> int:
        """The priority header's, else the objective header's, else the model's objective's, else the
        default."""
        if explicit is not None:
            try:
                return int(explicit)
            except ValueError:
                band = next((b for b in self.queue.bands if b.name == explicit), None)
                if band is None:
                    raise Refused(400, f"unknown priority {explicit!r}", "BadRequestError") from None
                return band.priority
        objectives = self.cfg.objectives
        if objective is not None and objective in objectives:
            return objectives[objective]
        return objectives.get(model, self.cfg.default_priority)

    async def acquire(self, p: Pending) -> Endpoint:
        if not self.pool.may_serve(p.model):
            raise Refused(404, f"The model `{p.model}` does not exist (no endpoint of this pool serves it).",
                          "NotFoundError")
        held = self.queue.offer(p, p.priority, self.clock())
        label = self.queue.band_for(p.priority).label
        if held is None:
            self._outcome(label, "RejectedCapacity", p)
            raise Refused(429, f"the gateway queue of priority band {label!r} is full", "RateLimitError")
        self.pump()  # sets the queue-size gauges after (a request dispatched at once never shows in them)
        try:
            return await p.future
        except asyncio.CancelledError:  # the client went away while waiting (or just as it was sent)
            self.queue.cancel(held)
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                self.release(p)
            else:
                self._outcome(label, "EvictedContextCancelled", p)
            self._sizes()
            raise

    def pump(self) -> None:
        expired = pump(self.queue, self.detector, self.pool.routable(), self._dispatch, self.clock(),
                       self._serving)
        for held in expired:
            p = held.item
            none = not self.pool.routable()
            self._outcome(held.band.label, "EvictedNoEndpoints" if none else "EvictedTTL", p)
            why = "no endpoint became ready" if none else "every endpoint stayed saturated"
            if not p.future.done():
                p.future.set_exception(Refused(503, f"the request waited {held.band.ttl:g}s in the gateway "
                                                    f"queue (its TTL) and {why}", "ServiceUnavailableError"))
        self._sizes()

    def refreshed(self) -> None:
        """The pool's metrics were refreshed (or an endpoint came back): capacity may have freed."""
        self.pump()
        self.publish()

    def publish(self) -> None:
        """The pool-saturation gauge: set at every refresh and before every /metrics render, so a
        scrape reads it as of now (not on every request: it is read only when scraped)."""
        m = self.metrics
        m.child(m.saturation, m.pool, "effective").set(self.detector.saturation(self.pool.routable()))

    @staticmethod
    def _serving(held: Held, room: list[Endpoint]) -> list[Endpoint]:
        model, now = held.item.model, time.monotonic()
        return [e for e in room if e.serves(model) and e.busy_until <= now]  # busy: it answered 429

    def _dispatch(self, held: Held, room: list[Endpoint]) -> None:
        p = held.item
        if p.future.done():  # cancelled meanwhile
            return
        ep = self.pick(p, room)
        self._outcome(held.band.label, "Dispatched", p)
        p.future.set_result(ep)

    def pick(self, p: Pending, candidates: list[Endpoint]) -> Endpoint:
        t0 = time.perf_counter()
        ep = candidates[self.router.pick(candidates, hashes=p.hashes, session=p.session)]
        self.metrics.pick_seconds.observe(time.perf_counter() - t0)
        self.take(ep, p)
        return ep

    def retry_target(self, p: Pending, tried: set[str]) -> Endpoint | None:
        """Another endpoint for a request that failed before its first byte (None: none left)."""
        self.release(p, pump=False)
        now = time.monotonic()
        others = [e for e in self.pool.routable()
                  if e.url not in tried and e.serves(p.model) and e.busy_until <= now]
        return self.pick(p, others) if others else None

    def take(self, ep: Endpoint, p: Pending) -> None:
        p.endpoint = ep
        ep.outstanding += 1
        ep.in_flight_tokens += p.tokens
        ep.served += 1

    def release(self, p: Pending, pump: bool = True) -> None:
        ep, p.endpoint = p.endpoint, None
        if ep is None:
            return
        ep.outstanding -= 1
        ep.in_flight_tokens -= p.tokens
        if ep.draining and ep.outstanding == 0:
            self.pool.sync([u for u, e in self.pool.endpoints.items() if not e.draining])
        if pump and len(self.queue):  # freed room matters only to held requests (none: pump is a no-op)
            self.pump()

    def _outcome(self, band: str, outcome: str, p: Pending) -> None:
        m = self.metrics
        m.child(m.flow_requests, outcome, band, m.pool).inc()
        m.child(m.queue_duration, band, outcome, m.pool).observe(max(0.0, self.clock() - p.arrived))

    def _sizes(self) -> None:
        m, last = self.metrics, self._sizes_set
        for label, n in self.queue.sizes().items():
            if last.get(label) != n:
                last[label] = n
                m.child(m.queue_size, label, m.pool).set(n)
