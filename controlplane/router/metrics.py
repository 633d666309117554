"""The router's Prometheus metrics: llm-d's EPP names where llm-d has one (`llm_d_epp_`), ours
(`slopilot_router_`) otherwise. Gauges of the pool are set at each refresh; the rest as requests go.

    llm_d_epp_flow_control_queue_size{priority,inference_pool}     requests held in the gateway queue
    llm_d_epp_flow_control_pool_saturation{inference_pool,stage}   1.0: no endpoint has room (or none)
    llm_d_epp_flow_control_requests_total{outcome,priority,...}    Dispatched, RejectedCapacity, EvictedTTL...
    llm_d_epp_flow_control_request_queue_duration_seconds          time in the gateway queue
    llm_d_epp_inflight_requests{endpoint_name}, llm_d_epp_inflight_tokens{endpoint_name}
    llm_d_epp_ready_endpoints{name}, llm_d_epp_per_endpoint_queue_size{name,model_server_endpoint}
    llm_d_epp_request_total{model_name,priority}                   arrivals
    slopilot_router_request_tokens_total{priority,kind}            their prompt tokens (kind="prompt", the
                                                                   router's count) and requested output
                                                                   tokens ("max_output": max_tokens where
                                                                   given): a band's length mix
    llm_d_epp_request_error_total{model_name,priority,error_code}
    llm_d_epp_request_ttft_seconds{model_name,priority,streaming}  from arrival to the first byte out
    llm_d_epp_scheduler_e2e_duration_seconds                       one filter-score-pick
    slopilot_router_requests_total{endpoint,code}                  answers by endpoint and HTTP status
    slopilot_router_retries_total{reason}, slopilot_router_ejections_total{endpoint}
    slopilot_router_endpoint_healthy{endpoint}
    slopilot_router_bad_samples_total{endpoint}                    /metrics samples skipped (out of range)
    slopilot_router_loop_restarts_total                            times the refresh loop died and restarted
    slopilot_router_kv_events_{batches,missed,replayed,resyncs,bad}_total, slopilot_router_kv_index_blocks
                                                                   {endpoint,medium}: the precise scorer's
                                                                   KV events (controlplane.router.precise)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PICK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)


class RouterMetrics:
    def __init__(self, pool: str = "default"):
        self.pool = pool
        r = self.registry = CollectorRegistry()
        self.queue_size = Gauge("llm_d_epp_flow_control_queue_size", "Requests held in the gateway queue",
                                ["priority", "inference_pool"], registry=r)
        self.saturation = Gauge("llm_d_epp_flow_control_pool_saturation",
                                "Pool saturation gating dispatch (>= 1: no endpoint has room)",
                                ["inference_pool", "stage"], registry=r)
        self.flow_requests = Counter("llm_d_epp_flow_control_requests", "Requests by flow-control outcome",
                                     ["outcome", "priority", "inference_pool"], registry=r)
        self.queue_duration = Histogram("llm_d_epp_flow_control_request_queue_duration_seconds",
                                        "Time from entering the gateway queue to its outcome",
                                        ["priority", "outcome", "inference_pool"], buckets=LATENCY_BUCKETS,
                                        registry=r)
        self.inflight = Gauge("llm_d_epp_inflight_requests", "Requests in flight on each endpoint",
                              ["endpoint_name"], registry=r)
        self.inflight_tokens = Gauge("llm_d_epp_inflight_tokens", "Prompt tokens in flight on each endpoint",
                                     ["endpoint_name"], registry=r)
        self.ready = Gauge("llm_d_epp_ready_endpoints", "Ready endpoints in the pool", ["name"], registry=r)
        self.endpoint_queue = Gauge("llm_d_epp_per_endpoint_queue_size", "Per-endpoint waiting queue",
                                    ["name", "model_server_endpoint"], registry=r)
        self.requests = Counter("llm_d_epp_request", "Requests received", ["model_name", "priority"],
                                registry=r)
        self.request_tokens = Counter("slopilot_router_request_tokens", "Prompt tokens (the router's "
                                      "count) and requested output tokens of arriving requests",
                                      ["priority", "kind"], registry=r)
        self.errors = Counter("llm_d_epp_request_error", "Requests answered with an error",
                              ["model_name", "priority", "error_code"], registry=r)
        self.ttft = Histogram("llm_d_epp_request_ttft_seconds", "From arrival to the first response byte",
                              ["model_name", "priority", "streaming"], buckets=LATENCY_BUCKETS, registry=r)
        self.pick_seconds = Histogram("llm_d_epp_scheduler_e2e_duration_seconds",
                                      "Time of one filter-score-pick", buckets=PICK_BUCKETS, registry=r)
        self.answers = Counter("slopilot_router_requests", "Answers by endpoint and HTTP status",
                               ["endpoint", "code"], registry=r)
        self.retries = Counter("slopilot_router_retries", "Requests sent again to another endpoint",
                               ["reason"], registry=r)
        self.ejections = Counter("slopilot_router_ejections", "Endpoints ejected after failures",
                                 ["endpoint"], registry=r)
        self.healthy = Gauge("slopilot_router_endpoint_healthy", "1 while the endpoint takes requests",
                             ["endpoint"], registry=r)
        self.bad_samples = Counter("slopilot_router_bad_samples", "Scraped gauge samples skipped as out of "
                                   "range (NaN, infinite, negative, huge)", ["endpoint"], registry=r)
        self.loop_restarts = Counter("slopilot_router_loop_restarts", "Times the endpoint refresh loop died "
                                     "and was restarted", registry=r)

        self._children: dict[tuple, object] = {}

    def child(self, metric, *labels: str):
        """metric.labels(*labels), remembered: the per-request label lookups are the hot ones."""
        key = (id(metric), *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def arrived(self, model: str, priority: int) -> None:
        self.child(self.requests, model, str(priority)).inc()

    def tokens(self, priority: int, prompt: int, max_output) -> None:
        """An arriving request's prompt tokens and its max_tokens (when a positive integer)."""
        self.child(self.request_tokens, str(priority), "prompt").inc(prompt)
        if isinstance(max_output, int) and not isinstance(max_output, bool) and max_output > 0:
            self.child(self.request_tokens, str(priority), "max_output").inc(max_output)

    def first_byte(self, p, streaming: bool, seconds: float) -> None:
        self.child(self.ttft, p.model, str(p.priority), "true" if streaming else "false").observe(seconds)

    def answered(self, endpoint: str, code: str) -> None:
        self.child(self.answers, endpoint, code).inc()

    def forget(self, endpoint: str, pool: str | None = None) -> None:
        self._children = {k: v for k, v in self._children.items() if endpoint not in k[1:]}
        for g in (self.inflight, self.inflight_tokens, self.healthy, self.bad_samples):
            try:
                g.remove(endpoint)
            except KeyError:
                pass
        try:
            self.endpoint_queue.remove(pool or self.pool, endpoint)
        except KeyError:
            pass
