"""Fetching engine /metrics pages for the direct-scrape source: the URL, one page within a deadline,
a round over many endpoints, and the page's samples with Prometheus' target labels.

    for url, t, samples, error in fetch_round(client, urls, timeout, job, clock):
        ...   # samples: [(name, labels, value)], or None with the error that failed the scrape
"""

from __future__ import annotations

import threading
import time
from typing import Callable
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]
Fetched = tuple[str, float, list[Sample] | None, str | None]


def metrics_url(endpoint: str) -> str:
    """`host:port`, `http://host:port` or a full URL; the path defaults to /metrics."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    parts = urlsplit(endpoint)
    return endpoint if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def parse_page(text: str, instance: str, job: str) -> list[Sample]:
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


def fetch_page(client: httpx.Client, url: str, timeout: float, job: str,
               clock: Callable[[], float]) -> Fetched:
    """One scrape of `url`: (url, its start time, samples or None, error or None)."""
    t = clock()  # Prometheus stamps a scrape with its start time
    # the page is read chunk by chunk and dropped at the deadline, so a dripping endpoint's worker
    # thread ends (and its connection closes) instead of outliving the round: the pool's threads
    # are joined when the process exits, and one stuck on a page dripped for ever hung that exit
    deadline = time.monotonic() + timeout
    try:
        with client.stream("GET", url) as r:
            r.raise_for_status()
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if time.monotonic() > deadline:
                    return url, t, None, f"no complete page within {timeout:g}s"
        text = body.decode(r.encoding or "utf-8", errors="replace")
        return url, t, parse_page(text, urlsplit(url).netloc, job), None
    except (httpx.HTTPError, ValueError) as exc:
        return url, t, None, f"{type(exc).__name__}: {exc}"


def fetch_round(client: httpx.Client, urls: list[str], timeout: float, job: str,
                clock: Callable[[], float]) -> list[Fetched]:
    """Every URL fetched at once; a page not complete within `timeout` is that endpoint's failed scrape."""
    # the timeout bounds each whole page (a page dripped a byte a second never trips a read's). Each
    # fetch runs in a daemon thread (a pool's threads are joined at exit, so one stuck on a head
    # dripped for ever hung the process's exit); fetch_page itself gives up on a dripped body
    t0, end = clock(), time.monotonic() + timeout
    answers: dict[int, Fetched] = {}
    arrived = threading.Semaphore(0)

    def fetch(i: int, url: str) -> None:
        answers[i] = fetch_page(client, url, timeout, job, clock)
        arrived.release()

    for i, url in enumerate(urls):
        threading.Thread(target=fetch, args=(i, url), name="scrape", daemon=True).start()
    for _ in urls:
        if not arrived.acquire(timeout=max(0.0, end - time.monotonic())):
            break
    late = f"no complete page within {timeout:g}s"
    return [answers.get(i, (u, t0, None, late)) for i, u in enumerate(urls)]
