"""The endpoints behind the router: discovery, metrics refresh, passive ejection, active health checks.

Every refresh (100 ms by default) reads the discovered URLs (a new one joins at once; a vanished one
drains: it finishes what it has and gets nothing new) and scrapes each live endpoint's /metrics. A
refused connection ejects an endpoint at once; other failures (a 5xx, a timeout, a failed scrape)
eject it after `eject_after` in a row. Ejected endpoints get a GET /health every health interval and
come back on a 200.

The loop must outlive any page an engine sends: out-of-range samples are skipped (logged once per
endpoint, counted in slopilot_router_bad_samples_total), an unreadable page is a failed scrape, and
`supervise` restarts the loop if it dies anyway (logged, counted, and /health answers 503 while it
is down or stalled), since held requests are dispatched from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from controlplane.router.answer import UpstreamError
from controlplane.router.endpoints import METRICS_QUERY, Endpoint, read_gauges
from controlplane.router.metrics import RouterMetrics
from controlplane.router.upstream import Upstream
from routing.config import RouterConfig
from routing.scorers import routable

log = logging.getLogger("slopilot.router")


def base_url(url: str) -> str:
    url = url if "://" in url else "http://" + url
    return url.rstrip("/")


class Pool:
    def __init__(self, cfg: RouterConfig, discover: Callable[[], list[str]], metrics: RouterMetrics,
                 clock: Callable[[], float] = time.monotonic, name: str | None = None):
        self.cfg, self.discover, self.metrics, self.clock = cfg, discover, metrics, clock
        self.name = name or metrics.pool  # the pool label of its gauges (P/D: a prefill pool beside it)
        self.endpoints: dict[str, Endpoint] = {}
        self._next_id = 0
        self._routable: list[Endpoint] | None = None  # cached; reset whenever health or membership changes
        self.on_change: Callable[[], None] = lambda: None  # the gate's pump: capacity may have freed
        self.on_leave: Callable[[str], None] = lambda url: None  # an endpoint left (its cached blocks too)
        self.loop_alive = False  # the refresh loop runs (False while it restarts after dying)
        self.loop_restarts = 0
        self.refreshed_at = clock()  # when the last refresh round finished

    # -- membership ------------------------------------------------------------------------------
    def sync(self, urls: list[str]) -> None:
        current = {base_url(u) for u in urls}
        for url in current:
            ep = self.endpoints.get(url)
            if ep is None:
                self.endpoints[url] = Endpoint(url, self._next_id)
                self._next_id += 1
                self.metrics.healthy.labels(url).set(1)
                log.info("endpoint %s joined", url)
            elif ep.draining:
                ep.draining = False
        for url, ep in list(self.endpoints.items()):
            if url not in current:
                ep.draining = True
                if ep.outstanding == 0:
                    del self.endpoints[url]
                    self.metrics.forget(url, self.name)
                    self.on_leave(url)
                    log.info("endpoint %s left", url)
        self._routable = None

    def routable(self) -> list[Endpoint]:
        """Healthy endpoints not draining (the same list until one of those changes: do not modify)."""
        if self._routable is None:
            self._routable = routable(list(self.endpoints.values()))
        return self._routable

    def may_serve(self, model: str) -> bool:
        """False only when every endpoint has named its models and none is `model` (then 404); with
        no endpoint at all (scaled to zero) a request waits for one."""
        eps = [e for e in self.endpoints.values() if not e.draining]
        return not eps or any(e.serves(model) for e in eps)

    # -- failures --------------------------------------------------------------------------------
    def failed(self, ep: Endpoint, why: str, refused: bool = False) -> None:
        ep.failures += 1
        if ep.healthy and (refused or ep.failures >= self.cfg.eject_after):
            ep.healthy = False
            self._routable = None
            self.metrics.ejections.labels(ep.url).inc()
            self.metrics.healthy.labels(ep.url).set(0)
            log.warning("endpoint %s ejected: %s", ep.url, why)

    def succeeded(self, ep: Endpoint) -> None:
        ep.failures = 0

    def readmit(self, ep: Endpoint) -> None:
        ep.healthy, ep.failures = True, 0
        self._routable = None
        self.metrics.healthy.labels(ep.url).set(1)
        log.info("endpoint %s readmitted", ep.url)

    # -- the loops -------------------------------------------------------------------------------
    async def scrape(self, client: Upstream, ep: Endpoint) -> None:
        then, t = ep.outstanding, self.clock()
        try:
            status, body = await client.get(ep.url, "/metrics?" + METRICS_QUERY, self.cfg.scrape_timeout)
        except UpstreamError as exc:
            self.failed(ep, f"scrape: {exc}", refused=exc.refused)
            return
        if status >= 400:
            self.failed(ep, f"scrape: HTTP {status}")
            return
        bad: list[str] = []
        try:
            gauges, models = read_gauges(body.decode("utf-8", "replace"), bad)
            ep.scraped(gauges, models, then, t)
        except Exception as exc:  # a page no engine should send: a failed scrape, never a dead loop
            self.failed(ep, f"scrape: unreadable /metrics page ({exc!r})")
            return
        if bad:
            if not ep.bad_samples:
                log.warning("endpoint %s: /metrics samples out of range skipped (NaN, infinite, negative "
                            "or over 1e9; logged once per endpoint, counted in "
                            "slopilot_router_bad_samples_total): %s", ep.url, "; ".join(bad[:3]))
            ep.bad_samples += len(bad)
            self.metrics.child(self.metrics.bad_samples, ep.url).inc(len(bad))

    async def refresh(self, client: Upstream) -> None:
        """One round: discovery, then a scrape of every endpoint that is not ejected."""
        try:
            self.sync(self.discover())  # must not block: a static list, a fleet's, or a cache
        except Exception as exc:  # a failing discovery keeps the last known endpoints
            log.warning("endpoint discovery failed: %r", exc)
        live = [ep for ep in self.endpoints.values() if ep.healthy]
        if live:
            await asyncio.gather(*(self.scrape(client, ep) for ep in live))
        self.publish()
        self.on_change()

    async def check_health(self, client: Upstream) -> None:
        """Every ejected endpoint at once (one round takes one timeout, not one per endpoint)."""
        await asyncio.gather(*(self._check(client, ep) for ep in self.endpoints.values() if not ep.healthy))

    async def _check(self, client: Upstream, ep: Endpoint) -> None:
        try:
            status, _ = await client.get(ep.url, "/health", self.cfg.scrape_timeout)
        except UpstreamError:
            return
        if status == 200 and not ep.healthy:
            self.readmit(ep)
            await self.scrape(client, ep)
            self.on_change()

    async def supervise(self, client: Upstream, stop: asyncio.Event) -> None:
        """`run` until `stop`, started again (after a short pause) whenever it dies."""
        while not stop.is_set():
            try:
                self.loop_alive = True
                await self.run(client, stop)
            except Exception:
                self.loop_alive = False
                self.loop_restarts += 1
                self.metrics.loop_restarts.inc()
                log.exception("the endpoint refresh loop died; restarting it (restart %d)",
                              self.loop_restarts)
                try:
                    await asyncio.wait_for(stop.wait(), min(1.0, 5 * self.cfg.refresh_interval))
                except asyncio.TimeoutError:
                    pass
        self.loop_alive = False

    def loop_problem(self) -> str | None:
        """Why the refresh loop is not doing its job now (None: it is)."""
        if not self.loop_alive:
            return f"the endpoint refresh loop is down (restarts: {self.loop_restarts})"
        # a round waits one scrape timeout, then one health-check timeout, then the interval
        age, bound = self.clock() - self.refreshed_at, 5.0 + 2 * self.cfg.scrape_timeout \
            + 10 * self.cfg.refresh_interval
        if age > bound:
            return f"the endpoint refresh loop has not finished a round for {age:.1f} s"
        return None

    async def run(self, client: Upstream, stop: asyncio.Event) -> None:
        next_health = self.clock()
        while not stop.is_set():
            t0 = self.clock()
            await self.refresh(client)
            self.refreshed_at = self.clock()
            if self.clock() >= next_health:
                next_health = self.clock() + self.cfg.health_interval
                await self.check_health(client)
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, self.cfg.refresh_interval - (self.clock() - t0)))
            except asyncio.TimeoutError:
                pass

    def publish(self) -> None:
        m, pool = self.metrics, self.name
        m.child(m.ready, pool).set(len(self.routable()))
        for ep in self.endpoints.values():
            m.child(m.endpoint_queue, pool, ep.url).set(ep.num_waiting)
            m.child(m.inflight, ep.url).set(ep.outstanding)
            m.child(m.inflight_tokens, ep.url).set(ep.in_flight_tokens)
