"""The direct-scrape source on pages served in-process (httpx.MockTransport, a test clock): a real
vLLM 0.32 page, SGLang- and vLLM-shaped pages made with prometheus_client, outages, restarts, removed
endpoints, per-trigger errors, and the Observation the simulator would build from the same events."""

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autoscaler.spec import load_spec
from controlplane.sources.scrape import ScrapeSource, metrics_url
from engine.core.buckets import ITL_BUCKETS, TTFT_BUCKETS
from simulator.metrics import MetricStore, quantile_of
from simulator.replica_metrics import LAYOUT, ReplicaMetrics

SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
              0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Pages:
    """url -> a page (text, or a registry rendered at each GET); a missing url refuses the connection."""

    def __init__(self):
        self.pages: dict[str, object] = {}
        self.gets = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.gets += 1
        page = self.pages.get(str(request.url))
        if page is None:
            raise httpx.ConnectError("connection refused", request=request)
        text = page if isinstance(page, str) else generate_latest(page).decode()
        return httpx.Response(200, text=text)

    def source(self, urls, clock, **kw) -> ScrapeSource:
        return ScrapeSource(urls, clock=clock, transport=httpx.MockTransport(self.handler), **kw)


def spec_with(*queries: str, policy: str = "keda"):
    triggers = "".join(
        f"\n    - type: prometheus\n      name: t{i}\n      metadata: {{query: '{q}', threshold: '5'}}"
        for i, q in enumerate(queries))
    return load_spec(f"""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: x}}
spec:
  scaleTargetRef: {{name: x}}
  triggers:{triggers}
""")


# ---- a real vLLM /metrics page ------------------------------------------------------------------
def vllm_page(shared_data: Path) -> str:
    path = shared_data / "vllm" / "metrics-vllm-0.32-cpu.txt"
    if not path.is_file():
        pytest.skip(f"no captured vLLM page at {path}")
    return path.read_text()


def add_to(page: str, name: str, by: float, match: str = "") -> str:
    """The page with `by` added to every sample named `name` whose label text contains `match`."""
    def bump(m: re.Match) -> str:
        return f"{m.group(1)} {float(m.group(2)) + by!r}"
    pattern = re.compile(rf"^({re.escape(name)}(?:\{{[^}}]*{re.escape(match)}[^}}]*\}})?) (\S+)$", re.M)
    out, n = pattern.subn(bump, page)
    assert n > 0, f"{name} {match} not on the page"
    return out


def observe_on(page: str, hist: str, value: float, count: int) -> str:
    """The page after `count` more observations of `value` in histogram `hist`."""
    for m in re.finditer(rf'^{re.escape(hist)}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}} ', page, re.M):
        if float(m.group(1)) >= value:
            page = add_to(page, hist + "_bucket", count, f'le="{m.group(1)}"')
    return add_to(add_to(page, hist + "_count", count), hist + "_sum", count * value)


def test_real_vllm_page(shared_data):
    page = vllm_page(shared_data)
    pages, clock = Pages(), Clock(100.0)
    pages.pages["http://e1:8000/metrics"] = page
    src = pages.source(["http://e1:8000"], clock, window=60.0, aggregates="all")
    ttft = "histogram_quantile(0.9, sum(rate(vllm:time_to_first_token_seconds_bucket[1m])) by (le))"
    spec = spec_with("sum(vllm:num_requests_waiting)", "sum(vllm:gpu_cache_usage_perc)", ttft)
    src.scrape()
    later = add_to(page, "vllm:request_success_total", 20, 'finished_reason="length"')
    later = add_to(later, "vllm:request_prompt_tokens_sum", 20 * 100)
    later = add_to(later, "vllm:request_generation_tokens_sum", 20 * 50)
    later = observe_on(later, "vllm:time_to_first_token_seconds", 0.3, 20)
    later = add_to(add_to(later, "vllm:num_requests_waiting", 3), "vllm:num_requests_running", 7)
    later = add_to(later, "vllm:kv_cache_usage_perc", 0.25)
    pages.pages["http://e1:8000/metrics"] = later
    clock.t = 110.0
    obs = src.observe(spec, now=110.0, current=1, ready=1)
    # two samples 10 s apart in a 60 s window, the first 50 s after the window's start: Prometheus
    # extrapolates half a scrape interval before it, so 20 requests count as 20 * 15 / 10
    assert obs.arrival_rate == pytest.approx(20 * 1.5 / 60)
    assert (obs.mean_prompt_tokens, obs.mean_output_tokens) == pytest.approx((100.0, 50.0))
    assert (obs.num_waiting, obs.num_running, obs.kv_usage) == (3.0, 7.0, 0.25)
    # all 20 new TTFTs in vLLM's (0.25, 0.5] bucket: linear inside it
    assert obs.ttft_p == pytest.approx({50.0: 0.375, 90.0: 0.475, 99.0: 0.4975})
    assert obs.tpot_p == {} and obs.itl_p == {}  # nothing new in those histograms: no answer, no error
    assert obs.metrics["t0"] == 3.0 and obs.metrics["t2"] == pytest.approx(0.475)
    assert obs.errors == {"t1"}  # vLLM 0.32 has no gpu_cache_usage_perc: a clear per-trigger error
    assert "vllm:gpu_cache_usage_perc" in src.last_errors["t1"] and "1 scraped page" in src.last_errors["t1"]
    assert src.engine_for_aggregates() == "vllm"


# ---- pages made with prometheus_client -------------------------------------------------------------
class SglangEngine:
    """An SGLang-shaped exporter: SGLang's metric names, labels and default buckets."""

    def __init__(self, model: str = "qwen", rank: str = "0"):
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model, "engine_type": "unified", "tp_rank": rank}
        names = list(labels)

        def g(name):
            return Gauge(name, name, names, registry=r).labels(**labels)

        def c(name):
            return Counter(name, name, names, registry=r).labels(**labels)

        self.running, self.queue, self.usage = g("sglang:num_running_reqs"), g("sglang:num_queue_reqs"), \
            g("sglang:token_usage")
        g("sglang:gen_throughput")
        self.requests, self.prompt, self.generated = c("sglang:num_requests_total"), \
            c("sglang:prompt_tokens_total"), c("sglang:generation_tokens_total")
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "ttft", names, buckets=SGLANG_TTFT,
                              registry=r).labels(**labels)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "itl", names, buckets=SGLANG_ITL,
                             registry=r).labels(**labels)

    def finish(self, n: int, prompt: int, output: int, ttft: float, itl: float) -> None:
        for _ in range(n):
            self.requests.inc()
            self.prompt.inc(prompt)
            self.generated.inc(output)
            self.ttft.observe(ttft)
            self.itl.observe(itl)


def test_sglang_pages():
    pages, clock = Pages(), Clock(0.0)
    engines = {u: SglangEngine(rank="0") for u in ("http://a:30000/metrics", "http://b:30000/metrics")}
    pages.pages.update((u, e.registry) for u, e in engines.items())
    src = pages.source(list(engines), clock, window=30.0, aggregates="all")
    spec = spec_with("sum(sglang:num_queue_reqs)", "avg(sglang:token_usage)",
                     "sum(vllm:num_requests_waiting)")
    a, b = engines.values()
    for t in range(0, 31, 5):  # 2 + 1 requests finish per second over 30 s
        clock.t = float(t)
        if t:
            a.finish(10, prompt=200, output=40, ttft=0.3, itl=0.02)
            b.finish(5, prompt=500, output=40, ttft=0.7, itl=0.02)
        src.scrape()
    a.queue.set(4), b.queue.set(6), a.running.set(12), b.running.set(3), a.usage.set(0.5), b.usage.set(0.25)
    clock.t = 30.5
    obs = src.observe(spec, now=30.5, current=2)
    assert src.engine_for_aggregates() == "sglang"
    assert (obs.num_waiting, obs.num_running, obs.kv_usage) == (10.0, 15.0, 0.375)
    # samples at 5..30 and observe()'s own at 30.5: 75 requests over 25.5 s sampled, extrapolated 4.5 s
    # back to the window's start (less than 1.1 average intervals) and 0 s forward
    assert obs.arrival_rate == pytest.approx(75 * 30 / 25.5 / 30)
    assert obs.mean_prompt_tokens == pytest.approx((10 * 200 + 5 * 500) / 15)
    assert obs.mean_output_tokens == pytest.approx(40.0)
    # two thirds of the TTFTs are 0.3 s (bucket (0.2, 0.4]), one third 0.7 s (bucket (0.6, 0.8])
    assert obs.ttft_p[50.0] == pytest.approx(0.2 + 0.2 * 0.75)
    assert obs.ttft_p[90.0] == pytest.approx(0.6 + 0.2 * 0.7)
    assert obs.itl_p[50.0] == pytest.approx(0.015 + 0.005 * 0.5)
    # SGLang exports no per-request TPOT: left empty and said why, not counted as an outage
    assert obs.tpot_p == {} and "tpot_p" not in obs.errors
    assert "sglang:time_per_output_token_seconds_bucket" in src.last_errors["tpot_p"]
    assert obs.metrics["t0"] == 10.0 and obs.metrics["t1"] == 0.375
    assert obs.errors == {"t2"} and "vllm:num_requests_waiting" in src.last_errors["t2"]


class VllmEngine:
    """Our engine's vLLM names (as engine/metrics.py exports them), driven by hand."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        lab = {"model_name": "m", "engine": "0"}

        def h(name, buckets):
            return Histogram(name, name, list(lab), buckets=buckets, registry=r).labels(**lab)

        self.waiting = Gauge("vllm:num_requests_waiting", "", list(lab), registry=r).labels(**lab)
        self.running = Gauge("vllm:num_requests_running", "", list(lab), registry=r).labels(**lab)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", list(lab), registry=r).labels(**lab)
        success = Counter("vllm:request_success", "", list(lab) + ["finished_reason"], registry=r)
        self.success = {f: success.labels(**lab, finished_reason=f) for f in ("stop", "length")}
        self.prompt = h("vllm:request_prompt_tokens", (1, 10, 100, 1000, 10000))
        self.output = h("vllm:request_generation_tokens", (1, 10, 100, 1000, 10000))
        self.ttft = h("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.tpot = h("vllm:request_time_per_output_token_seconds", ITL_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", ITL_BUCKETS)


def test_observation_equals_the_simulators_on_the_same_events():
    """The same finished requests and gauges, recorded by the simulator's replica metrics and by two
    vLLM-named exporters, read through the simulator's store and through the scrape source."""
    rng = np.random.default_rng(3)
    pages, clock = Pages(), Clock(0.0)
    urls = ["http://r0:8000/metrics", "http://r1:8000/metrics"]
    live = {u: VllmEngine() for u in urls}
    pages.pages.update((u, e.registry) for u, e in live.items())
    src = pages.source(urls, clock, window=60.0, aggregates="all")
    sim = {u: ReplicaMetrics() for u in urls}
    store = MetricStore()
    last_gauges = {}
    for t in np.arange(0.0, 95.0, 7.3):  # scrape times never on the window's edge
        clock.t = float(t)
        for u in urls:
            e, m = live[u], sim[u]
            for _ in range(int(rng.integers(5, 40))):
                prompt, output = int(rng.integers(20, 3000)), int(rng.integers(2, 500))
                ttft, tpot = float(rng.lognormal(-1.5, 0.8)), float(rng.lognormal(-3.3, 0.4))
                reason = "stop" if rng.random() < 0.3 else "length"
                e.success[reason].inc(), e.prompt.observe(prompt), e.output.observe(output)
                e.ttft.observe(ttft), e.tpot.observe(tpot), e.itl.observe(tpot)
                for name in ("arrivals", "request_success"):
                    m.inc(name)
                m.inc("request_prompt_tokens_sum", prompt), m.inc("request_output_tokens_sum", output)
                m.observe("time_to_first_token_seconds", ttft)
                m.observe("request_time_per_output_token_seconds", tpot)
                m.observe("inter_token_latency_seconds", tpot)
            gauges = {"waiting": float(rng.integers(0, 9)), "running": float(rng.integers(0, 64)),
                      "kv_usage": float(rng.random())}
            e.waiting.set(gauges["waiting"]), e.running.set(gauges["running"]), e.kv.set(gauges["kv_usage"])
            store.scrape(u, float(t), m.cumulative(), gauges)
            last_gauges[u] = gauges
        src.scrape()
    now = clock.t = clock.t + 0.5
    for u in urls:  # observe() scrapes once more: the simulator's store gets the same sample
        store.scrape(u, now, sim[u].cumulative(), last_gauges[u])
    obs = src.observe(None, now=now, current=2)
    rates = store.rate(urls, now, 60.0)
    done = rates[LAYOUT["request_success"]]
    assert obs.arrival_rate == pytest.approx(rates[LAYOUT["arrivals"]], rel=1e-9)
    prompt, output = rates[LAYOUT["request_prompt_tokens_sum"]], rates[LAYOUT["request_output_tokens_sum"]]
    assert obs.mean_prompt_tokens == pytest.approx(prompt / done, rel=1e-9)
    assert obs.mean_output_tokens == pytest.approx(output / done, rel=1e-9)
    assert obs.num_waiting == sum(store.gauge(urls, "waiting", now))
    assert obs.num_running == sum(store.gauge(urls, "running", now))
    assert obs.kv_usage == pytest.approx(np.mean(store.gauge(urls, "kv_usage", now)), rel=1e-12)
    for table, hist in ((obs.ttft_p, "time_to_first_token_seconds"),
                        (obs.tpot_p, "request_time_per_output_token_seconds"),
                        (obs.itl_p, "inter_token_latency_seconds")):
        assert table == pytest.approx({p: quantile_of(rates, hist, p / 100) for p in (50.0, 90.0, 99.0)},
                                      rel=1e-9)


# ---- failures ------------------------------------------------------------------------------------
def test_outage_is_an_error_never_a_zero():
    pages, clock = Pages(), Clock(0.0)
    engines = {u: VllmEngine() for u in ("http://a:1/metrics", "http://b:1/metrics")}
    pages.pages.update((u, e.registry) for u, e in engines.items())
    src = pages.source(list(engines), clock, aggregates="all")
    spec = spec_with("sum(vllm:num_requests_waiting)")
    assert src.observe(spec, 0.0, 2).errors == set()
    pages.pages.clear()  # both engines stop answering
    clock.t = 15.0
    obs = src.observe(spec, 15.0, 2)
    assert obs.errors == {"t0", "arrival_rate", "mean_prompt_tokens", "num_waiting", "num_running",
                          "kv_usage", "ttft_p", "tpot_p", "itl_p"}
    assert obs.metrics == {} and obs.num_waiting is None and obs.arrival_rate is None
    assert "scrape failed on all 2 endpoint(s)" in src.last_errors["t0"]
    assert "ConnectError" in src.last_errors["t0"]


def test_one_endpoint_down_removed_or_restarted():
    pages, clock = Pages(), Clock(0.0)
    a, b = VllmEngine(), VllmEngine()
    endpoints = ["a:1", "b:1"]
    pages.pages.update({"http://a:1/metrics": a.registry, "http://b:1/metrics": b.registry})
    src = pages.source(lambda: endpoints, clock, window=60.0)
    spec = spec_with("sum(vllm:num_requests_running)", "sum(rate(vllm:request_success_total[1m]))")
    a.running.set(5), b.running.set(7)
    for t in (0.0, 10.0, 20.0):
        clock.t = t
        a.success["stop"].inc(10), b.success["stop"].inc(20)
        src.scrape()
    del pages.pages["http://b:1/metrics"]  # b stops answering: its gauge is stale at once
    clock.t = 30.0
    obs = src.observe(spec, 30.0, 2, 1)
    assert obs.errors == set() and obs.metrics["t0"] == 5.0
    # b's samples (up to t=20) still count. a: +20 over 30 s sampled; its start is 30 s before the
    # window's and its zero 15 s before the first sample, both past 1.1 intervals: half an interval
    # added. b: +40 over 20 s, zero 10 s back and end 10 s ahead, within 1.1 intervals: both added.
    assert obs.metrics["t1"] == pytest.approx((20 * 35 / 30 + 40 * 40 / 20) / 60)

    b2 = VllmEngine()  # b restarts: its counters start again from zero
    pages.pages["http://b:1/metrics"] = b2.registry
    b2.running.set(1)
    b2.success["stop"].inc(3)
    clock.t = 40.0
    obs = src.observe(spec, 40.0, 2)
    assert obs.metrics["t0"] == 6.0
    assert obs.metrics["t1"] > 0  # the reset is an increase of 3, not a drop of 57

    endpoints.remove("b:1")  # scaled down: stale now, gone once out of the window
    clock.t = 50.0
    assert src.observe(spec, 50.0, 1).metrics["t0"] == 5.0
    clock.t = 50.0 + src.retention + 1
    src.scrape()
    assert list(src.targets) == ["http://a:1/metrics"]


def test_no_endpoints_reads_as_an_idle_fleet():
    pages, clock = Pages(), Clock(0.0)
    src = pages.source([], clock, aggregates="all")
    obs = src.observe(spec_with("sum(vllm:num_requests_waiting)"), 0.0, 0, 0)
    assert obs.errors == set() and obs.metrics == {"t0": None}  # empty: the policy's ignoreNullValues decides
    assert (obs.arrival_rate, obs.num_waiting, obs.num_running, obs.kv_usage) == (0.0, 0.0, 0.0, None)
    assert obs.ttft_p == {} and obs.mean_prompt_tokens is None


def test_per_trigger_errors_do_not_stop_the_others():
    pages, clock = Pages(), Clock(0.0)
    e1, e2 = VllmEngine(), VllmEngine()
    pages.pages.update({"http://a:1/metrics": e1.registry, "http://b:1/metrics": e2.registry})
    src = pages.source(["a:1", "b:1"], clock)
    spec = spec_with("vllm:num_requests_waiting", "vllm:num_requests_waiting[1m]",
                     "sum(vllm:num_requests_waiting", "sum(vllm:num_requests_running)",
                     # beyond the old subset: the one evaluator (the simulator's) answers any PromQL
                     "sum(vllm:num_requests_waiting) > 2",
                     "max(max_over_time(vllm:num_requests_running[1m]))")
    obs = src.observe(spec, 0.0, 2)
    assert obs.errors == {"t0", "t1", "t2"} and obs.metrics == {"t3": 0.0, "t4": None, "t5": 0.0}
    assert "multiple elements (2)" in src.last_errors["t0"]
    assert "is a range vector" in src.last_errors["t1"]
    assert "does not parse" in src.last_errors["t2"]


def test_policy_reads_decide_what_is_queried():
    pages, clock = Pages(), Clock(0.0)
    e = VllmEngine()
    pages.pages["http://a:1/metrics"] = e.registry
    keda = spec_with("sum(vllm:num_requests_waiting)")
    assert pages.source(["a:1"], clock).observe(keda, 0.0, 1).arrival_rate is None  # keda: triggers only
    slo = load_spec((Path(__file__).resolve().parents[2] / "examples" / "replay" / "ratio.yaml").read_text())
    obs = pages.source(["a:1"], clock).observe(slo, 0.0, 1)
    assert obs.arrival_rate == 0.0 and obs.num_waiting is None  # the ratio policy reads no queue


def test_background_scraping_at_a_phase():
    import time
    pages = Pages()
    e = VllmEngine()
    pages.pages["http://a:1/metrics"] = e.registry
    src = ScrapeSource(["a:1"], transport=httpx.MockTransport(pages.handler))
    src.start(0.1, phase=0.05)
    time.sleep(0.65)
    src.close()
    times = src.targets["http://a:1/metrics"].times
    assert 4 <= len(times) <= 8
    assert all(abs((t - 0.05) % 0.1 - 0.05) > 0.03 for t in times)  # near the phase, not half off it


def test_metrics_url():
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:1/") == "http://h:1/metrics"
    assert metrics_url("https://h:1/custom/path") == "https://h:1/custom/path"
