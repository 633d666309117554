"""The live router's precise prefix scorer: its KV event feed (its EndpointPickerConfig parameters are
read by routing.precise.precise_params).

    - type: precise-prefix-cache-scorer
      parameters: {blockSize: 16, tokenizer: byte, zmqEndpoint: "tcp://127.0.0.1:5557",
                   mediumWeights: {GPU: 1.0, CPU: 0.8}}

The router binds a SUB socket on zmqEndpoint; each engine publishes to it (`serve` or `vllm serve`
with `--kv-events-config '{"enable_kv_cache_events": true, "endpoint": "tcp://ROUTER:5557", "topic":
"kv@HOST:PORT@MODEL"}'`), its topic naming the endpoint the router reaches it at (llm-d's
convention). blockSize and tokenizer must give the engines' own block hashes (the prefix scorer's
parameters, shared); blocks of another size are ignored and counted.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from routing.kv_index import KVBlockIndex
from routing.kv_subscriber import KVEventSubscriber, llmd_topic_key
from routing.precise import DEFAULT_ZMQ_ENDPOINT, uses_index


def endpoint_key(topic: str) -> str:
    """A topic's endpoint as the router's pool names it: kv@127.0.0.1:8001@tiny -> http://127.0.0.1:8001."""
    key = llmd_topic_key(topic)
    return (key if "://" in key else "http://" + key).rstrip("/")


def kv_feed(cfg, router) -> KVEventSubscriber | None:
    """The index the router's precise scorer reads and the subscriber that fills it (started by the
    caller), or None when the scorer is not in use. ValueError when the socket cannot be bound."""
    if not uses_index(router.weights):
        return None
    router.kv_index = KVBlockIndex(cfg.prefix_block(), cfg.kv_medium_weights)
    sub = KVEventSubscriber(router.kv_index, key_for_topic=endpoint_key)
    sub.bind(cfg.kv_events_endpoint or DEFAULT_ZMQ_ENDPOINT)
    return sub


class KVEventsCollector:
    """The subscriber's counts and the index's size on the router's /metrics, read at scrape time:
    slopilot_router_kv_events_{batches,missed,replayed,resyncs,bad}_total and
    slopilot_router_kv_index_blocks{endpoint,medium}."""

    HELP = {"batches": "KV event batches applied", "missed": "KV event batches found missing (sequence gaps)",
            "replayed": "missing KV event batches recovered from an engine's replay socket",
            "resyncs": "times an endpoint's blocks were forgotten (an unrecoverable gap, or a restart)",
            "bad": "messages that were not KV event batches"}

    def __init__(self, sub: KVEventSubscriber):
        self.sub = sub

    def collect(self):
        s = self.sub.stats
        values = {"batches": s.batches, "missed": s.gaps, "replayed": s.replayed, "resyncs": s.resyncs,
                  "bad": s.bad}
        for name, help_text in self.HELP.items():
            yield CounterMetricFamily(f"slopilot_router_kv_events_{name}", help_text, value=values[name])
        g = GaugeMetricFamily("slopilot_router_kv_index_blocks", "Blocks each endpoint holds, by medium, "
                              "as its KV events say", labels=["endpoint", "medium"])
        for ep, counts in self.sub.index.by_medium().items():
            for medium, n in counts.items():
                g.add_metric([str(ep), medium], n)
        yield g
