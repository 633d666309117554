"""Direct scrape of engine /metrics endpoints, for users without Prometheus.

Each round GETs every endpoint (httpx, with a timeout), parses the page with prometheus_client's
parser and keeps a short history per endpoint. Queries are answered by controlplane.sources.promql as
Prometheus 2.x answers them: rate()/increase() extrapolated to the window's edges with counter resets,
histogram_quantile with linear interpolation, gauges from the latest scrape of each endpoint that is
up (a failed or removed endpoint's gauges are stale at once, its samples still count in rates).
If every endpoint fails, every query fails: an outage is never read as zero.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.prometheus import QueryError
from controlplane.prometheus_server import JOB
from controlplane.sources.base import DEFAULT_WINDOW, QuerySource
from controlplane.sources.names import detect_engine
from controlplane.sources.promql import Labels, Selector, Vector, evaluate, metric_names, parse
from simulator.scenario import Scenario

DEFAULT_TIMEOUT = 5.0
LOOKBACK = 300.0  # Prometheus' instant-query lookback


def metrics_url(endpoint: str) -> str:
    """`host:port`, `http://host:port` or a full URL; the path defaults to /metrics."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    parts = urlsplit(endpoint)
    return endpoint if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def parse_page(text: str, instance: str, job: str) -> list[tuple[str, Labels, float]]:
    """(sample name, labels, value) of a text-format page, with Prometheus' target labels added."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            for key, value in (("instance", instance), ("job", job)):
                if key in labels:  # as Prometheus does without honor_labels
                    labels["exported_" + key] = labels[key]
                labels[key] = value
            labels["__name__"] = s.name
            out.append((s.name, labels, float(s.value)))
    return out


class Target:
    """One endpoint's scrape history: a column per series, a row per successful scrape."""

    def __init__(self, url: str):
        self.url = url
        self.instance = urlsplit(url).netloc
        self.columns: dict[tuple, int] = {}
        self.labels: list[Labels] = []
        self.by_name: dict[str, list[int]] = {}
        self.times: list[float] = []
        self.rows: list[np.ndarray] = []
        self.up = False
        self.error: str | None = None

    def add(self, t: float, samples: list[tuple[str, Labels, float]]) -> None:
        cols, values = [], []
        for name, labels, value in samples:
            key = tuple(sorted(labels.items()))
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = len(self.labels)
                self.labels.append(labels)
                self.by_name.setdefault(name, []).append(col)
            cols.append(col)
            values.append(value)
        row = np.full(len(self.labels), np.nan)
        row[cols] = values
        self.times.append(t)
        self.rows.append(row)

    def prune(self, before: float) -> None:
        drop = 0
        while drop < len(self.times) and self.times[drop] < before:
            drop += 1
        del self.times[:drop], self.rows[:drop]

    def matching(self, sel: Selector) -> list[int]:
        return [c for c in self.by_name.get(sel.name, ()) if sel.matches(self.labels[c])]

    def names(self) -> set[str]:
        row = self.rows[-1] if self.rows else np.empty(0)
        return {n for n, cols in self.by_name.items() if any(c < len(row) and row[c] == row[c] for c in cols)}


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

    def _fetch(self, url: str) -> tuple[str, float, list | None, str | None]:
        t = self.clock()  # Prometheus stamps a scrape with its start time
        # the page is read chunk by chunk and dropped at the deadline, so a dripping endpoint's worker
        # thread ends (and its connection closes) instead of outliving the round: the pool's threads
        # are joined when the process exits, and one stuck on a page dripped for ever hung that exit
        deadline = time.monotonic() + self.timeout
        try:
            with self._client.stream("GET", url) as r:
                r.raise_for_status()
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        return url, t, None, f"no complete page within {self.timeout:g}s"
            text = body.decode(r.encoding or "utf-8", errors="replace")
            return url, t, parse_page(text, urlsplit(url).netloc, self.job), None
        except (httpx.HTTPError, ValueError) as exc:
            return url, t, None, f"{type(exc).__name__}: {exc}"

    def scrape(self, only: Iterable[str] | None = None) -> dict[str, str | None]:
        """One round over the current endpoints (or `only` these); endpoint -> error (None = scraped)."""
        listed = self.endpoints()
        urls = listed if only is None else [metrics_url(u) for u in only]
        # the timeout bounds each whole page (a page dripped a byte a second never trips a read's): a
        # fetch still running at the deadline is that endpoint's failed scrape. Each fetch runs in a
        # daemon thread (a pool's threads are joined at exit, so one stuck on a head dripped for ever
        # hung the process's exit); _fetch itself gives up on a dripped body at the deadline
        t0, end = self.clock(), time.monotonic() + self.timeout
        answers: dict[int, tuple[str, float, list | None, str | None]] = {}
        arrived = threading.Semaphore(0)

        def fetch(i: int, url: str) -> None:
            answers[i] = self._fetch(url)
            arrived.release()

        for i, url in enumerate(urls):
            threading.Thread(target=fetch, args=(i, url), name="scrape", daemon=True).start()
        for _ in urls:
            if not arrived.acquire(timeout=max(0.0, end - time.monotonic())):
                break
        late = f"no complete page within {self.timeout:g}s"
        results = [answers.get(i, (u, t0, None, late)) for i, u in enumerate(urls)]
        with self._lock:
            current = self._current = set(listed)
            for url, t, samples, error in results:
                target = self.targets.setdefault(url, Target(url))
                target.up, target.error = samples is not None, error
                if samples is not None:
                    target.add(t, samples)
            horizon = self.clock() - self.retention
            for url, target in list(self.targets.items()):
                if url not in current:
                    target.up = False  # removed from the fleet: stale now, still in rates for a while
                target.prune(horizon)
                if url not in current and not target.times:
                    del self.targets[url]
        return {url: error for url, _, _, error in results}

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

    # -- the store the PromQL evaluator reads ----------------------------------------------------
    def instant(self, sel: Selector, at: float) -> Vector:
        out = []
        for target in self.targets.values():
            if not target.up:
                continue
            i = next((k for k in range(len(target.times) - 1, -1, -1) if target.times[k] <= at), None)
            if i is None or at - target.times[i] > LOOKBACK:
                continue
            row = target.rows[i]
            out += [(target.labels[c], float(row[c])) for c in target.matching(sel)
                    if c < len(row) and not np.isnan(row[c])]
        return out

    def range(self, sel: Selector, start: float, end: float):
        self.retention = max(self.retention, end - start + 60.0)
        out = []
        for target in self.targets.values():
            # closed on both ends, as Prometheus 2.x selects a range
            idx = range(bisect.bisect_left(target.times, start), bisect.bisect_right(target.times, end))
            for c in target.matching(sel):
                ts, vs = [], []
                for k in idx:
                    row = target.rows[k]
                    if c < len(row) and not np.isnan(row[c]):
                        ts.append(target.times[k])
                        vs.append(float(row[c]))
                if ts:
                    out.append((target.labels[c], ts, vs))
        return out

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
        return len(up), set().union(*(t.names() for t in up)) if up else set()

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

    def evaluate(self, text: str, at: float, check_missing: bool = True) -> Vector:
        """The answer to `text` at time `at` from the scrape history (raises QueryError, ValueError).

        check_missing: a metric on none of the scraped pages is an error (else an empty answer)."""
        tree = self._trees.get(text)
        if tree is None:
            tree = self._trees[text] = parse(text)
        with self._lock:
            outage = self._outage()
            if outage:
                raise QueryError(outage)
            for name in sorted(metric_names(tree)) if check_missing else ():
                why = self.missing(name)
                if why:
                    raise QueryError(why)
            out = evaluate(tree, self, at)
        return [({}, out)] if isinstance(out, float) else out
