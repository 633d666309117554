"""The router's P/D profile in front of real engines: long uncached prompts take a prefill hop then a
decode hop (same text as one aggregated engine, streamed too), short ones go whole to decode, a dead
prefill pool is a clean 503 that leaves nothing held, and the decisions are counted in /metrics."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.pd import PDSettings
from controlplane.router.server import RouterServer
from routing.config import RouterConfig
from tests.engine.test_kv_transfer_server import model_dir, server  # noqa: F401 - the shared fixture
from tests.server_helpers import CMPL, assert_error, free_port, metric, wait_for

THRESHOLD = 64


def router(decode_urls: list[str], prefill_urls: list[str]) -> RouterServer:
    return RouterServer(build_router_app(RouterConfig(refresh_interval=0.05), static(decode_urls),
                                         pd=PDSettings(prefill_urls, THRESHOLD))).start()


def r_dead(r: RouterServer) -> str:
    """The prefill endpoint the router has ejected (its health gauge at 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    page = httpx.get(r.url + "/metrics").text
    return next(s.labels["endpoint"] for f in text_string_to_metric_families(page) for s in f.samples
                if s.name == "slopilot_router_endpoint_healthy" and s.value == 0)


def body(ids, **extra) -> dict:
    return {"model": "m", "prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": True, **extra}


def streamed_text(r: httpx.Response) -> str:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.extend(c["text"] for c in json.loads(line[6:])["choices"])
    return "".join(out)


def test_two_hops_through_the_router(model_dir):  # noqa: F811
    rng = random.Random(2)
    short, long_a, long_b = ([rng.randrange(3, 384) for _ in range(n)] for n in (20, 400, 300))
    with server(model_dir, "kv_producer") as p, server(model_dir, "kv_consumer") as d, \
            server(model_dir, None) as a:
        r = router([d.url], [p.url])
        try:
            for ids, stream in ((short, False), (short, True), (long_a, False), (long_b, True),
                                (long_a, False)):
                want = httpx.post(a.url + CMPL, json=body(ids), timeout=60).json()["choices"][0]["text"]
                got = httpx.post(r.url + CMPL, json=body(ids, stream=stream), timeout=60)
                assert got.status_code == 200, got.text
                assert (streamed_text(got) if stream else got.json()["choices"][0]["text"]) == want
            # long_a the second time is cached on the decode endpoint (the router's prefix index): whole
            assert metric(r.url, "slopilot_router_pd_decisions_total", decision="aggregated") == 3
            assert metric(r.url, "slopilot_router_pd_decisions_total", decision="disaggregated") == 2
            assert metric(p.url, "vllm:prompt_tokens_total") == len(long_a) + len(long_b)
            assert wait_for(lambda: metric(p.url, "vllm:kv_cache_usage_perc") == 0.0
                            and metric(d.url, "vllm:kv_cache_usage_perc") == 0.0)
        finally:
            r.stop()


def test_no_prefill_endpoint_is_a_clean_503(model_dir):  # noqa: F811
    with server(model_dir, "kv_consumer") as d:
        r = router([d.url], [f"http://127.0.0.1:{free_port()}"])
        try:
            err = assert_error(httpx.post(r.url + CMPL, json=body(list(range(3, 203))), timeout=30), 503)
            assert "no prefill endpoint" in err["message"]
            # the dead endpoint was ejected by the router's scrape of it before the request came
            assert metric(r.url, "slopilot_router_endpoint_healthy", endpoint=r_dead(r)) == 0
            # the decode slot taken for it was given back: a short request still goes through
            assert httpx.post(r.url + CMPL, json=body([5, 6, 7]), timeout=30).status_code == 200
            assert metric(d.url, "vllm:kv_cache_usage_perc") == 0.0
        finally:
            r.stop()


def test_a_dead_prefill_endpoint_is_skipped_and_a_consumer_gone_mid_decode_frees(model_dir):  # noqa: F811
    ids = [3 + (7 * i) % 380 for i in range(300)]
    with server(model_dir, "kv_producer") as p, server(model_dir, "kv_consumer") as d:
        r = router([d.url], [f"http://127.0.0.1:{free_port()}", p.url])  # the dead one: ejected at a scrape
        try:
            got = httpx.post(r.url + CMPL, json=body(ids), timeout=60)
            assert got.status_code == 200, got.text
            assert metric(r.url, "slopilot_router_endpoint_healthy", endpoint=r_dead(r)) == 0
            # a client that leaves mid-decode: the decode engine aborts and frees; the producer's lease
            # ended at the consumer's read, before the decode began
            with httpx.stream("POST", r.url + CMPL, json=body(ids[::-1], max_tokens=500, stream=True),
                              timeout=60) as s:
                next(s.iter_lines())
            assert wait_for(lambda: metric(d.url, "vllm:kv_cache_usage_perc") == 0.0
                            and metric(p.url, "vllm:kv_cache_usage_perc") == 0.0, timeout=10)
            assert metric(d.url, "vllm:request_success_total", finished_reason="abort") == 1
        finally:
            r.stop()


def test_settings_refused():
    with pytest.raises(ValueError, match="prefill endpoint"):
        PDSettings([])
    with pytest.raises(ValueError, match="pd-threshold"):
        PDSettings(["http://x"], -1)
