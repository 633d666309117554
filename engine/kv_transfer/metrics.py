"""KV-transfer series on the engine's /metrics, under vLLM 0.32's NIXL connector names.

Histograms of each pull (time, bytes) and counters of failed pulls on the consumer, of leases that
expired unread on the producer, with vLLM's buckets; plus this engine's role as an info gauge and
the blocks held by leases now (ours: vLLM has no such gauge).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

XFER_TIME_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]  # 2 KiB to 8 GiB, as vLLM's


class KVTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, engine_index: int, kv_role: str):
        labels = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": str(engine_index)}
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds", "KV transfer (pull) duration.", labels,
                                   buckets=XFER_TIME_BUCKETS, registry=registry).labels(**values)
        self.xfer_bytes = Histogram("vllm:nixl_bytes_transferred", "Bytes moved per KV transfer.", labels,
                                    buckets=BYTES_BUCKETS, registry=registry).labels(**values)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Failed KV transfers (the prompt was "
                              "computed here instead).", labels, registry=registry).labels(**values)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs", "Requests whose KV lease expired unread "
                               "(on the producer).", labels, registry=registry).labels(**values)
        self.leased = Gauge("slopilot:kv_transfer_leased_blocks", "KV blocks held for consumers now.",
                            labels, registry=registry).labels(**values)
        Gauge("slopilot:kv_transfer_role_info", "This engine's kv_role.", labels + ["kv_role"],
              registry=registry).labels(**values, kv_role=kv_role).set(1)
        self._seen_failed = self._seen_expired = 0

    def sync(self, connector) -> None:
        """Takes what the connector recorded since the last call (engine thread)."""
        c, p = connector.consumer, connector.producer
        if c is not None:
            while c.transfers:
                seconds, nbytes = c.transfers.pop()
                self.xfer_time.observe(seconds)
                self.xfer_bytes.observe(nbytes)
            self.failed.inc(c.num_failed - self._seen_failed)
            self._seen_failed = c.num_failed
        if p is not None:
            self.expired.inc(p.num_expired - self._seen_expired)
            self._seen_expired = p.num_expired
            self.leased.set(p.num_leased_blocks)
