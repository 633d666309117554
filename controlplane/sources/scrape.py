"""Direct scrape of engine /metrics endpoints, for users without Prometheus.

Each round GETs every endpoint (controlplane.sources.pages) and appends the samples to a store
(promql.storage), stamped with the scrape's start time as Prometheus stamps them; queries are answered
by the one PromQL evaluator (promql), the simulator's, tested against Prometheus. As in Prometheus, a
failed scrape or a removed endpoint writes staleness markers (its gauges are stale at once, its
samples still count in rates), and so does a series gone from a page. If every endpoint fails, every
query fails: an outage is never read as zero.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import httpx

from autoscaler.prometheus import QueryError
from controlplane.prometheus_server import JOB
from controlplane.sources.base import DEFAULT_WINDOW, QuerySource, Vector
from controlplane.sources.names import detect_engine
from controlplane.sources.pages import Sample, fetch_round, metrics_url, parse_page
from promql import LOOKBACK, Evaluator, MemoryStorage, PromQLError, compile_query, labels_of, lookbehind
from promql.storage import Labels
from promql.tree import metric_names
from simulator.scenario import Scenario

DEFAULT_TIMEOUT = 5.0
__all__ = ["DEFAULT_TIMEOUT", "ScrapeSource", "metrics_url", "parse_page"]


def _ms(t: float) -> int:
    return round(t * 1000)


class Target:
    """One endpoint: up or not, why, the series and names of its last page, its scrape times."""

    def __init__(self, url: str):
        self.url = url
        self.instance = urlsplit(url).netloc
        self.up = False
        self.error: str | None = None
        self.series: set[Labels] = set()  # on the last successful page (to mark stale when gone)
        self.names: set[str] = set()
        self.times: list[float] = []  # successful scrapes within the retention

    def prune(self, before: float) -> None:
        drop = 0
        while drop < len(self.times) and self.times[drop] < before:
            drop += 1
        del self.times[:drop]


class ScrapeSource(QuerySource):
    """A MetricSource reading engine /metrics pages directly.

    endpoints: URLs (or a callable returning the current ones, e.g. the fleet's ready replicas).
    engine: "auto" (from the pages' names), "vllm", "sglang" or "slopilot".
    Without start(), each observe() scrapes once; with start(interval), a thread scrapes every
    interval (as Prometheus would) and observe() reads the history.
    """

    def __init__(self, endpoints: Iterable[str] | Callable[[], Iterable[str]], *, engine: str = "auto",
                 window: float = DEFAULT_WINDOW, selector: str = "", aggregates=None,
                 timeout: float = DEFAULT_TIMEOUT, retention: float | None = None,
                 clock: Callable[[], float] = time.time, headers: dict | None = None, verify=True,
                 job: str = JOB, transport: httpx.BaseTransport | None = None):
        super().__init__("vllm" if engine == "auto" else engine, window, selector, aggregates)
        self.auto = engine == "auto"
        self._endpoints = endpoints
        self.timeout = timeout
        self.retention = max(retention or 0.0, 4 * self.window, 600.0)
        self.clock = clock
        self.job = job
        self.targets: dict[str, Target] = {}
        self.store = MemoryStorage()
        self.evaluated_at: float | None = None
        self._client = httpx.Client(timeout=timeout, headers=headers, verify=verify, transport=transport)
        self._lock = threading.RLock()  # the scraping thread vs observe()
        self._trees: dict[str, object] = {}
        self._current: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- scraping --------------------------------------------------------------------------------------
    def endpoints(self) -> list[str]:
        eps = self._endpoints() if callable(self._endpoints) else self._endpoints
        return [metrics_url(e) for e in eps]

    def scrape(self, only: Iterable[str] | None = None) -> dict[str, str | None]:
        """One round over the current endpoints (or `only` these); endpoint -> error (None = scraped)."""
        listed = self.endpoints()
        urls = listed if only is None else [metrics_url(u) for u in only]
        results = fetch_round(self._client, urls, self.timeout, self.job, self.clock)
        with self._lock:
            current = self._current = set(listed)
            for url, t, samples, error in results:
                target = self.targets.setdefault(url, Target(url))
                target.up, target.error = samples is not None, error
                self._store(target, t, samples or [])
                if samples is not None:
                    target.names = {name for name, _, _ in samples}
                    target.times.append(t)
            now = self.clock()
            for url, target in list(self.targets.items()):
                if url not in current and target.up:  # removed from the fleet: stale now, in rates a while
                    target.up = False
                    self._store(target, now, [])
                target.prune(now - self.retention)
                if url not in current and not target.times:
                    del self.targets[url]
            self.store.prune(_ms(now - self.retention))
        return {url: error for url, _, _, error in results}

    def _store(self, target: Target, t: float, samples: list[Sample]) -> None:
        """A scrape's samples into the store; staleness markers for the series not on the page."""
        at, seen = _ms(t), set()
        for _, labels, value in samples:
            key = labels_of(labels)
            series = self.store.series.get(key)
            if key in seen or series is not None and series.ts and series.ts[-1] >= at:
                seen.add(key)  # on the page, but a duplicate or out-of-order sample: dropped, as
                continue       # Prometheus drops it (two scrapes stamped the same millisecond)
            seen.add(key)
            self.store.append(key, at, value)
        for key in target.series - seen:
            if key in self.store.series:
                self.store.mark_stale(key, at)
        target.series = seen

    def start(self, interval: float = Scenario.scrape_interval,
              phase: float | Mapping[str, float] | None = None) -> None:
        """Scrape in a thread every `interval` s. phase: scrape when clock() % interval == phase (one
        for all endpoints, or per endpoint URL, e.g. to sample when a Prometheus server does)."""
        phases = {metrics_url(u): p for u, p in phase.items()} if isinstance(phase, Mapping) else {}
        last: dict[str, float] = {}

        def due(url: str, now: float) -> float:
            if phase is None:
                return last.get(url, now - interval) + interval
            t = now + ((phases.get(url, 0.0) if phases else phase) - now) % interval
            return t + interval if t - last.get(url, -interval) < interval / 2 else t

        def loop():
            while not self._stop.is_set():
                now = self.clock()
                urls = self.endpoints()
                if not urls:
                    self.scrape()  # marks removed endpoints stale
                    self._stop.wait(min(interval, 0.5))
                    continue
                times = {u: due(u, now) for u in urls}
                first = min(times.values())
                if self._stop.wait(max(0.0, first - now)):
                    return
                batch = [u for u, t in times.items() if t - first < 0.002]
                last.update((u, first) for u in batch)
                self.scrape(batch)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="scrape-source", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
        self._client.close()

    # -- QuerySource -------------------------------------------------------------------------------
    def begin(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self.scrape()
        self.evaluated_at = self.clock()

    def _outage(self) -> str | None:
        current = [t for t in self.targets.values() if t.url in self._current]
        if current and not any(t.up for t in current):
            first = current[0]
            return f"scrape failed on all {len(current)} endpoint(s); {first.url}: {first.error}"
        return None

    def _up_names(self) -> tuple[int, set[str]]:
        up = [t for t in self.targets.values() if t.up]
        return len(up), set().union(*(t.names for t in up)) if up else set()

    def missing(self, name: str) -> str | None:
        with self._lock:
            n, names = self._up_names()
        if n and name not in names:
            return f"metric {name!r} is not on the {n} scraped page(s)"
        return None

    def engine_for_aggregates(self) -> str:
        if not self.auto:
            return self.engine
        with self._lock:
            return detect_engine(self._up_names()[1]) or self.engine

    def query(self, text: str, trigger=None) -> Vector:
        at = self.evaluated_at if self.evaluated_at is not None else self.clock()
        return self.evaluate(text, at, check_missing=trigger is not None)

    def compile(self, text: str):
        """The query's tree (cached); the retention grows to what it reads. PromQLError if refused."""
        tree = self._trees.get(text)
        if tree is None:
            tree = compile_query(text)
            if tree.type == "matrix":
                raise PromQLError(f"query {text!r} is a range vector; a trigger reads an instant vector "
                                  "or a scalar (e.g. rate(x[1m]))")
            reach = lookbehind(tree, LOOKBACK) / 1000  # refuses @ (no fixed time in a live query)
            self.retention = max(self.retention, reach + 60.0)
            self._trees[text] = tree
        return tree

    def evaluate(self, text: str, at: float, check_missing: bool = True) -> Vector:
        """The answer to `text` at time `at` from the scrape history (raises QueryError, ValueError).

        check_missing: a metric on none of the scraped pages is an error (else an empty answer)."""
        tree = self.compile(text)
        with self._lock:
            outage = self._outage()
            if outage:
                raise QueryError(outage)
            for name in sorted(metric_names(tree)) if check_missing else ():
                why = self.missing(name)
                if why:
                    raise QueryError(why)
            out = Evaluator(self.store).eval(tree, _ms(at))
        if isinstance(out, float):
            return [({}, out)]
        return [(dict(labels), value) for labels, value in out]

    def samples(self, name: str, start: float, end: float) -> list[tuple[dict, list[float], list[float]]]:
        """The stored samples of metric `name` in [start, end] (seconds): (labels, times, values)."""
        with self._lock:
            found = self.store.window(compile_query(name).matchers, _ms(start), _ms(end))
        return [(dict(lb), [t / 1000 for t in ts], list(vs)) for lb, ts, vs in found]
