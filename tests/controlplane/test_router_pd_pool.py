"""The P/D profile's prefill endpoints are a pool with the decode pool's machinery: the queue and KV
scorers pick among them from their scraped /metrics, a failing one is ejected and skipped (the request
goes to the next), /health brings it back, and a changing list (a scaled prefill fleet) is followed."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.pd import PDSettings
from controlplane.router.server import RouterServer
from routing.config import RouterConfig
from tests.fake_engine import FakeEngine
from tests.server_helpers import CMPL, metric, wait_for

BODY = {"model": "m", "prompt": "x" * 400, "max_tokens": 4}  # 400 characters: over the threshold


def fakes(n: int, producer: bool) -> list[FakeEngine]:
    out = []
    for _ in range(n):
        e = FakeEngine(chunks=1, chunk_delay=0.0)
        e.producer = producer
        out.append(e.start())
    return out


def router(decode: list[str], prefill, weights: dict[str, float], health: float = 0.1) -> RouterServer:
    rc = RouterConfig(policy="weighted", weights=weights, refresh_interval=0.05, health_interval=health)
    return RouterServer(build_router_app(rc, static(decode), pd=PDSettings(prefill, threshold=64))).start()


def send(r: RouterServer, n: int) -> None:
    for _ in range(n):
        got = httpx.post(r.url + CMPL, json=BODY, timeout=10, trust_env=False)
        assert got.status_code == 200, got.text


def served_by(decode: FakeEngine, k: int) -> list[int]:
    """The prefill endpoint (its port) behind each of the decode engine's last k requests."""
    return [kv["remote_port"] for kv in decode.kv_seen[-k:]]


def gauge(r: RouterServer, metric_name: str, **labels) -> float | None:
    """The router's sample with these labels (a `name` label too, which metric() cannot take); None."""
    page = httpx.get(r.url + "/metrics", trust_env=False).text
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == metric_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def queue_seen(r: RouterServer, url: str, value: float) -> bool:
    """The router's last scrape of this prefill endpoint read this waiting queue."""
    return gauge(r, "llm_d_epp_per_endpoint_queue_size", name="default-prefill",
                 model_server_endpoint=url) == value


def healthy(r: RouterServer, url: str) -> float | None:
    return gauge(r, "slopilot_router_endpoint_healthy", endpoint=url)


def ready(r: RouterServer) -> float | None:
    return gauge(r, "llm_d_epp_ready_endpoints", name="default-prefill")


def test_queue_scorer_picks_the_shorter_prefill_queue_and_follows_it():
    (d,), (a, b) = fakes(1, False), fakes(2, True)
    a.waiting, b.waiting = "20", "0"
    r = router([d.url], [a.url, b.url], {"queue": 1.0})
    try:
        assert wait_for(lambda: queue_seen(r, a.url, 20))
        send(r, 6)
        assert served_by(d, 6) == [b.port] * 6 and a.requests == 0
        a.waiting, b.waiting = "0", "20"
        assert wait_for(lambda: queue_seen(r, b.url, 20))
        send(r, 6)
        assert served_by(d, 6) == [a.port] * 6
        assert ready(r) == 2
    finally:
        r.stop()
        for e in (d, a, b):
            e.stop()


def test_kv_scorer_picks_the_emptier_prefill_cache():
    (d,), (a, b) = fakes(1, False), fakes(2, True)
    a.kv, b.kv = "0.9", "0.05"
    r = router([d.url], [a.url, b.url], {"kv": 1.0})
    try:
        assert wait_for(lambda: gauge(r, "llm_d_epp_per_endpoint_queue_size", name="default-prefill",
                                      model_server_endpoint=a.url) is not None)
        time.sleep(0.2)  # a few refreshes more: both scraped (the KV usage has no gauge of its own)
        send(r, 5)
        assert served_by(d, 5) == [b.port] * 5 and a.requests == 0
    finally:
        r.stop()
        for e in (d, a, b):
            e.stop()


def test_a_failing_prefill_endpoint_is_ejected_skipped_and_readmitted():
    (d,), (a, b) = fakes(1, False), fakes(2, True)
    a.waiting, b.waiting = "0", "10"  # the scorer prefers a
    r = router([d.url], [a.url, b.url], {"queue": 1.0}, health=3.0)
    try:
        assert wait_for(lambda: queue_seen(r, b.url, 10))
        a.mode = "500"
        send(r, 1)  # a is tried, fails; the request goes on to b
        assert a.requests == 1 and served_by(d, 1) == [b.port]
        assert metric(r.url, "slopilot_router_prefill_hop_failures_total", endpoint=a.url, reason="500") == 1
        assert metric(r.url, "slopilot_router_ejections_total", endpoint=a.url) == 1
        assert healthy(r, a.url) == 0
        # ejected: no longer tried, though its /metrics still say it is the emptier one
        send(r, 3)
        assert a.requests == 1 and served_by(d, 3) == [b.port] * 3
        # its /health answers 200 (the fake's): the next health check readmits it
        a.mode = "ok"
        assert wait_for(lambda: healthy(r, a.url) == 1, timeout=8)
        send(r, 3)
        assert served_by(d, 3) == [a.port] * 3
        # a dead one (refused) is ejected by the scrape before any request is sent to it
        a.stop()
        assert wait_for(lambda: healthy(r, a.url) == 0)
        before = a.requests
        send(r, 3)
        assert served_by(d, 3) == [b.port] * 3 and a.requests == before
    finally:
        r.stop()
        for e in (d, b):
            e.stop()


def test_a_scaled_prefill_list_is_followed():
    (d,), (a, b) = fakes(1, False), fakes(2, True)
    urls = [a.url]
    r = router([d.url], lambda: list(urls), {"queue": 1.0})
    try:
        send(r, 2)
        assert served_by(d, 2) == [a.port] * 2
        urls[:] = [b.url]  # a scaled in, b out
        assert wait_for(lambda: ready(r) == 1 and queue_seen(r, b.url, 0) and healthy(r, a.url) is None)
        send(r, 2)
        assert served_by(d, 2) == [b.port] * 2
        urls[:] = []  # scaled to zero: a clean 503, not a hang
        assert wait_for(lambda: ready(r) == 0)
        got = httpx.post(r.url + CMPL, json=BODY, timeout=10, trust_env=False)
        assert got.status_code == 503 and "no prefill endpoint" in got.json()["error"]["message"]
    finally:
        r.stop()
        for e in (d, a, b):
            e.stop()


def test_shared_kv_takes_a_prefill_answer_without_params_and_sends_the_original_body():
    """A connector that shares KV through storage keyed by the prompt (vLLM's ExampleConnector) answers
    the prefill hop without kv_transfer_params: refused as a misconfigured producer by default, taken
    with shared_kv (both hops still run, and the decode hop gets the client's body)."""
    (prefill,), (decode,) = fakes(1, producer=False), fakes(1, producer=False)
    for shared in (False, True):
        rc = RouterConfig(policy="weighted", refresh_interval=0.05)
        pd = PDSettings([prefill.url], threshold=64, shared_kv=shared)
        r = RouterServer(build_router_app(rc, static([decode.url]), pd=pd)).start()
        try:
            got = httpx.post(r.url + CMPL, json=BODY, timeout=10, trust_env=False)
            if not shared:
                assert got.status_code == 503 and "--pd-shared-kv" in got.json()["error"]["message"]
                continue
            assert got.status_code == 200, got.text
            assert prefill.kv_seen[-1] == {"do_remote_decode": True}  # the prefill hop ran
            assert decode.kv_seen[-1] is None  # the decode hop: the client's body, no parameters added
            assert metric(r.url, "slopilot_router_pd_decisions_total", decision="disaggregated") == 1
        finally:
            r.stop()
    prefill.stop()
    decode.stop()
