"""vLLM-named Prometheus metrics for one engine, on a registry of its own.

Names, types, labels and buckets follow vLLM's v1 engine (see ../shared/reference), so a
vLLM-aware autoscaler or dashboard reads our engine unchanged. Every method is called from the
engine thread; prometheus_client's metrics are thread-safe, so /metrics can scrape at any time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.core.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from engine.core.sequence import Sequence

FINISHED_REASONS = ("stop", "length", "abort", "error")


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class EngineMetrics:
    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, object] | None = None,
                 engine_index: int = 0, offload: bool = False):
        """offload: the engine has an offload tier (its series are registered only then, as vLLM
        registers its connector's only with a connector)."""
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": str(engine_index)}
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(**values)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(**values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self._seen_external = (0, 0)
        if offload:
            self._offload_series(counter, gauge)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ["finished_reason"], registry=reg)
        self.success = {r: success.labels(**values, finished_reason=r) for r in FINISHED_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency, seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Mean time per output token of a request, in seconds.", ITL_BUCKETS)
        lat = REQUEST_LATENCY_BUCKETS
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", lat)
        self.queue = histogram("vllm:request_queue_time_seconds", "Time spent in WAITING phase.", lat)
        self.inference = histogram("vllm:request_inference_time_seconds", "Time spent in RUNNING phase.", lat)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "Time spent in PREFILL phase.", lat)
        self.decode = histogram("vllm:request_decode_time_seconds", "Time spent in DECODE phase.", lat)
        tok = buckets_1_2_5(max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", tok)
        self.req_gen = histogram("vllm:request_generation_tokens", "Generated tokens per request.", tok)
        if cache_info is not None:  # an info gauge: the cache configuration rides in its labels
            info = {k: str(v) for k, v in cache_info.items()}
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
                  list(info) + ["engine"], registry=reg).labels(**info, engine=str(engine_index)).set(1)
        self._last_token: dict[str, float] = {}
        self._seen_queries = self._seen_hits = self._seen_preemptions = 0

    def _offload_series(self, counter, gauge) -> None:
        # the offload tier: vLLM counts its hits as a KV connector's, "external" to the device cache
        self.external_queries = counter("vllm:external_prefix_cache_queries",
                                        "External prefix cache queries from KV connector cross-instance "
                                        "cache sharing, in terms of number of queried tokens.")
        self.external_hits = counter("vllm:external_prefix_cache_hits",
                                     "External prefix cache hits from KV connector cross-instance cache "
                                     "sharing, in terms of number of cached tokens.")
        self.offload_counters = {
            "load_bytes": counter("vllm:kv_offload_load_bytes",
                                  "Total bytes loaded from offload storage to GPU."),
            "load_seconds": counter("vllm:kv_offload_load_time",
                                    "Total load time from offload storage to GPU, in seconds."),
            "store_bytes": counter("vllm:kv_offload_store_bytes",
                                   "Total bytes stored from GPU to offload storage."),
            "store_seconds": counter("vllm:kv_offload_store_time",
                                     "Total store time from GPU to offload storage, in seconds."),
        }
        self.offload_blocks = gauge("slopilot:kv_offload_blocks", "KV blocks held in the offload tier.")
        self._seen_offload: dict[str, float] = dict.fromkeys(self.offload_counters, 0.0)

    def render(self, names: list[str] | None = None) -> bytes:
        """The text page; with names (`/metrics?name[]=...`, as prometheus_client's own handler and vLLM
        take them) only those series: a router scraping three gauges ten times a second skips the rest."""
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)

    # -- called by the engine thread -------------------------------------------------------------
    def record_step(self, engine, advanced: list[Sequence], now: float) -> None:
        """After a step: token counters, TTFT and inter-token latencies, and the scheduler gauges."""
        for seq in advanced:
            self.generation_tokens.inc()
            last = self._last_token.get(seq.request_id)
            if last is None:  # the first token: the prompt is done (vLLM counts it here)
                self.prompt_tokens.inc(seq.num_prompt_tokens)
                self.ttft.observe(seq.first_token_time - seq.arrival_time)
            else:
                self.itl.observe(now - last)
            self._last_token[seq.request_id] = now
        self.update_gauges(engine)

    def update_gauges(self, engine) -> None:
        sched, bm = engine.scheduler, engine.block_manager
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.kv_usage.set(bm.usage)  # evictable cached blocks count as free
        self.prefix_queries.inc(bm.prefix_cache_queries - self._seen_queries)
        self.prefix_hits.inc(bm.prefix_cache_hits - self._seen_hits)
        self.preemptions.inc(sched.num_preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = bm.prefix_cache_queries, bm.prefix_cache_hits
        self._seen_preemptions = sched.num_preemptions
        if bm.offload is not None and hasattr(self, "offload_counters"):
            self._update_offload(bm)

    def _update_offload(self, bm) -> None:
        tier = bm.offload
        self.external_queries.inc(bm.offload_queries - self._seen_external[0])
        self.external_hits.inc(bm.offload_hits - self._seen_external[1])
        self._seen_external = (bm.offload_queries, bm.offload_hits)
        now = {"load_bytes": tier.loaded_blocks * tier.block_bytes, "load_seconds": tier.load_seconds,
               "store_bytes": tier.stored_blocks * tier.block_bytes, "store_seconds": tier.store_seconds}
        for key, value in now.items():
            self.offload_counters[key].inc(value - self._seen_offload[key])
            self._seen_offload[key] = value
        self.offload_blocks.set(len(tier.index))

    def record_finished(self, seq: Sequence) -> None:
        """Once per request, when it finishes for any reason (stop, length, abort, error)."""
        self._last_token.pop(seq.request_id, None)
        self.success[seq.finish_reason or "error"].inc()
        end = seq.finish_time
        if end is None:
            return
        self.e2e.observe(end - seq.arrival_time)
        self.req_prompt.observe(seq.num_prompt_tokens)
        self.req_gen.observe(seq.num_output_tokens)
        if seq.first_scheduled_time is None:
            return
        self.queue.observe(seq.first_scheduled_time - seq.arrival_time)
        self.inference.observe(end - seq.first_scheduled_time)
        if seq.first_token_time is None:
            return
        self.prefill.observe(seq.first_token_time - seq.first_scheduled_time)
        self.decode.observe(end - seq.first_token_time)
        if seq.num_output_tokens > 1:
            self.tpot.observe((end - seq.first_token_time) / (seq.num_output_tokens - 1))
