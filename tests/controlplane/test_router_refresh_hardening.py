"""Issue finding 1: an engine whose /metrics reports +Inf, -Inf, 1e999 or NaN for its waiting queue
never stops the router's endpoint refresh (before and after the router starts); the sample is
skipped, logged once per endpoint and counted; a refresh loop that dies anyway is restarted, logged,
and shown by /health; the next good request is served each time."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.endpoints import read_gauges
from controlplane.router.server import RouterServer
from routing.config import RouterConfig
from tests.fake_engine import FakeEngine

BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}


@pytest.fixture
def engines():
    es = [FakeEngine(chunk_delay=0.001).start() for _ in range(2)]
    yield es
    for e in es:
        e.stop()


def test_out_of_range_samples_are_skipped_and_reported():
    bad: list[str] = []
    page = ("vllm:num_requests_waiting 1e999\nvllm:num_requests_waiting -Inf\nvllm:num_requests_waiting NaN\n"
            "vllm:num_requests_waiting -2\nvllm:num_requests_waiting 3\nvllm:num_requests_running 1e300\n")
    gauges, _ = read_gauges(page, bad)
    assert gauges == {"num_waiting": 3.0}
    assert len(bad) == 5


def test_inf_gauges_never_wedge_the_router(engines, caplog):
    a, b = engines
    a.waiting = "+Inf"  # already there when the router starts (it used to crash at start-up)
    caplog.set_level(logging.WARNING, "slopilot.router")
    with RouterServer(build_router_app(RouterConfig(refresh_interval=0.05), static([a.url, b.url]))) as r:
        st = r.state
        with httpx.Client(timeout=10) as c:
            for value in ("+Inf", "-Inf", "1e999", "NaN", "4", "+Inf"):
                a.waiting = value
                scraped = st.pool.refreshed_at
                deadline = time.monotonic() + 5
                while st.pool.refreshed_at < scraped + 0.1 and time.monotonic() < deadline:
                    time.sleep(0.02)  # a few refresh rounds on that value
                assert st.pool.refreshed_at > scraped, f"the refresh loop stopped on {value}"
                for _ in range(4):
                    assert c.post(r.url + "/v1/completions", json=BODY).status_code == 200
                health = c.get(r.url + "/health")
                assert health.status_code == 200 and health.json()["ready_endpoints"] == 2
            assert a.served > 0 and b.served > 0  # both kept serving
            metrics = c.get(r.url + "/metrics").text
        assert st.pool.loop_restarts == 0
        ep = st.pool.endpoints[a.url]
        assert ep.bad_samples >= 5 and st.pool.endpoints[b.url].bad_samples == 0
        assert f'slopilot_router_bad_samples_total{{endpoint="{a.url}"}}' in metrics
    warned = [m for m in caplog.messages if "out of range skipped" in m]
    assert len(warned) == 1 and a.url in warned[0]  # once per endpoint, not once per scrape


def test_a_dead_refresh_loop_is_restarted_and_shown_by_health(engines, caplog, monkeypatch):
    a, b = engines
    caplog.set_level(logging.ERROR, "slopilot.router")
    with RouterServer(build_router_app(RouterConfig(refresh_interval=0.05), static([a.url, b.url]))) as r:
        pool = r.state.pool
        real, calls = pool.publish, []

        def broken() -> None:  # a bug anywhere in a round: three rounds in a row die
            calls.append(1)
            if 1 < len(calls) <= 4:
                raise RuntimeError("a bug in the refresh round")
            real()

        monkeypatch.setattr(pool, "publish", broken)
        seen_503 = False
        deadline = time.monotonic() + 10
        with httpx.Client(timeout=10) as c:
            while pool.loop_restarts < 3 and time.monotonic() < deadline:
                h = c.get(r.url + "/health")
                if h.status_code == 503:
                    seen_503 = True
                    assert "refresh loop is down" in h.json()["status"]
                time.sleep(0.01)
            assert pool.loop_restarts == 3
            while not pool.loop_alive and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)
            h = c.get(r.url + "/health")
            assert h.status_code == 200 and h.json()["refresh_restarts"] == 3
            assert c.post(r.url + "/v1/completions", json=BODY).status_code == 200
            assert "slopilot_router_loop_restarts_total 3.0" in c.get(r.url + "/metrics").text
        assert seen_503
    assert sum("refresh loop died" in m for m in caplog.messages) == 3
