"""The controller's metric sources against a live vLLM: a steady streamed load of known lengths, the
/metrics page read by the direct-scrape source (engine "auto" and "vllm") and by a real Prometheus
through the Prometheus source; every aggregate the policies read is checked against what the client
measured (arrival rate, lengths, TTFT and TPOT medians) or against the page itself (gauges)."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from controlplane.sources import PrometheusSource, ScrapeSource
from controlplane.sources.scrape import parse_page
from tests.e2e.conftest import VLLM_MODEL

pytestmark = pytest.mark.vllm

WINDOW = 20.0
RATE = 4.0
PROMPT, OUTPUT = 100, 32


class StreamedLoad:
    """Streamed completions at a constant rate from a thread; TTFT and TPOT measured per request."""

    def __init__(self, url: str):
        self.url = url
        self.done: list[tuple[float, float, float]] = []  # (finish time, ttft, tpot), wall clock
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=120, trust_env=False)
        self._pool = ThreadPoolExecutor(max_workers=32)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.rng = np.random.default_rng(0)

    def _one(self, prompt: list[int]) -> None:
        # a chunk may carry several tokens when the client falls behind (vLLM merges pending deltas):
        # the count comes from the usage chunk, the times from the first and last chunks
        body = {"model": VLLM_MODEL, "prompt": prompt, "max_tokens": OUTPUT, "ignore_eos": True,
                "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
        sent, first, last, tokens = time.time(), None, None, 0
        try:
            with self._client.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code} {r.read()[:200]!r}")
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    if chunk.get("choices") and chunk["choices"][0]["text"]:
                        last = time.time()
                        first = first or last
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))
            return
        if tokens != OUTPUT or first is None:
            self.errors.append(f"{tokens} tokens generated, expected {OUTPUT}")
            return
        self.done.append((last, first - sent, (last - first) / (OUTPUT - 1)))

    def _run(self) -> None:
        start, sent = time.monotonic(), 0
        while not self._stop.wait(max(0.0, start + sent / RATE - time.monotonic())):
            self._pool.submit(self._one, [int(t) for t in self.rng.integers(32, 127, PROMPT)])
            sent += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._client.close()


LONG_PROMPT = 1900  # tokens: prefill-heavy requests keep the engine busy and vLLM's front end free


def long_prompt_request(url: str, seed: int) -> int:
    """One request of LONG_PROMPT prompt tokens and one output token; returns the prompt tokens."""
    prompt = [int(t) for t in np.random.default_rng(1000 + seed).integers(32, 127, LONG_PROMPT)]
    body = {"model": VLLM_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120, trust_env=False)
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens"]


def test_sources_read_live_vllm(vllm_server, prometheus):
    url = vllm_server.url
    prom = prometheus([url], scrape_interval=1.0)
    auto = ScrapeSource([url], engine="auto", window=WINDOW, aggregates="all")
    named = ScrapeSource([url], engine="vllm", window=WINDOW, aggregates="all")
    auto.start(1.0)
    named.start(1.0)
    via_prom = PrometheusSource(prom.url, engine="vllm", window=WINDOW, aggregates="all")
    sources = {"scrape auto": auto, "scrape vllm": named, "prometheus": via_prom}
    seen = {"num_running": 0.0, "kv_usage": 0.0}
    try:
        with StreamedLoad(url) as load:
            deadline = time.monotonic() + WINDOW + 8
            while time.monotonic() < deadline:  # gauges while the load runs
                obs = auto.observe(None, time.time(), current=1)
                seen["num_running"] = max(seen["num_running"], obs.num_running or 0.0)
                seen["kv_usage"] = max(seen["kv_usage"], obs.kv_usage or 0.0)
                time.sleep(0.5)
            now = time.time() - 1.0  # a second back: Prometheus has scraped it by now
            obs = {name: src.observe(None, now, current=1) for name, src in sources.items()}
            page = httpx.get(url + "/metrics", timeout=5, trust_env=False).text
        # vLLM's front end answers /metrics between its output bursts, so on a quiet machine the load's
        # short streams (~0.1 s each) are all done whenever a scrape is answered: the gauges are also
        # read while 48 prefill-heavy requests queue in the engine and leave the front end idle
        with ThreadPoolExecutor(48) as pool:
            heavy = [pool.submit(long_prompt_request, url, seed) for seed in range(48)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(f.done() for f in heavy):
                now_obs = auto.observe(None, time.time(), current=1)
                for key in seen:
                    seen[key] = max(seen[key], getattr(now_obs, key) or 0.0)
                time.sleep(0.25)
            assert all(f.result() == LONG_PROMPT for f in heavy)
    finally:
        auto.close()
        named.close()
        via_prom.close()

    assert not load.errors, load.errors[:3]
    assert auto.engine_for_aggregates() == "vllm"  # detected from the page's names
    names = {name for name, _, _ in parse_page(page, "vllm", "vllm")}
    for name in ("vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket"):
        assert name in names, f"{name} is not on vLLM's page"

    tpot_edges = sorted({float(labels["le"]) for name, labels, _ in parse_page(page, "vllm", "vllm")
                         if name == "vllm:request_time_per_output_token_seconds_bucket"})
    recent = np.array([d for d in load.done if now - WINDOW <= d[0] <= now])
    ttft, tpot = float(np.median(recent[:, 1])), float(np.median(recent[:, 2]))
    for name, o in obs.items():
        report = (f"{name}: rate {o.arrival_rate:.2f}/s (client {len(recent) / WINDOW:.2f}), "
                  f"lengths {o.mean_prompt_tokens:.1f}/{o.mean_output_tokens:.1f}, "
                  f"waiting {o.num_waiting} running {o.num_running} kv {o.kv_usage}, "
                  f"ttft p50 {o.ttft_p.get(50)} (client {ttft:.4f}), tpot p50 {o.tpot_p.get(50)} "
                  f"(client {tpot:.4f}), itl {o.itl_p}")
        print(report)
        assert not o.errors and not sources[name].last_errors, (name, sources[name].last_errors)
        assert o.arrival_rate == pytest.approx(RATE, rel=0.25), report
        assert o.mean_prompt_tokens == pytest.approx(PROMPT, abs=0.5), report
        assert o.mean_output_tokens == pytest.approx(OUTPUT, abs=0.5), report
        assert o.num_waiting is not None and o.num_running is not None and o.kv_usage is not None, report
        assert set(o.ttft_p) == set(o.tpot_p) == set(o.itl_p) == {50, 90, 99}, report
        # the server times from arrival, the client adds the HTTP path both ways
        assert 0.25 * ttft <= o.ttft_p[50] <= 1.25 * ttft, report
        # the server's own histogram, interpolated in vLLM's coarse buckets (10 ms, 25 ms, ...): a quantile
        # can land anywhere in the bucket that holds it, so the bound is the upper edge of the bucket
        # holding 1.3x the client's median (the client also counts the HTTP delivery)
        assert 0.25 * tpot <= o.tpot_p[50] <= min(le for le in tpot_edges if le >= 1.3 * tpot), report
        assert o.ttft_p[50] <= o.ttft_p[90] <= o.ttft_p[99], report
    assert seen["num_running"] >= 1, seen  # requests in flight were seen as running
    assert 0 < seen["kv_usage"] <= 1, seen
    # the two scrape sources read the same pages; Prometheus's scrapes agree on the rates
    a, p = obs["scrape auto"], obs["prometheus"]
    assert obs["scrape vllm"].arrival_rate == pytest.approx(a.arrival_rate, rel=0.1)
    assert p.arrival_rate == pytest.approx(a.arrival_rate, rel=0.15)
    assert p.mean_prompt_tokens == pytest.approx(a.mean_prompt_tokens, rel=0.01)
    assert p.tpot_p[50] == pytest.approx(a.tpot_p[50], rel=0.2)
