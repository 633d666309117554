"""ROUTER.yaml (EndpointPickerConfig-shaped), the gauge reader and the prompt reader of the router."""

from pathlib import Path

import pytest

from controlplane.router.endpoints import Endpoint, read_gauges
from controlplane.router.prompt import ByteTokenizer, PromptReader, chat_text, request_prompt
from routing.config import RouterConfig, load_router_config
from routing.config_schema import seconds
from routing.prefix import prefix_hashes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_examples_load():
    cfg = load_router_config(EXAMPLES / "router.yaml")
    assert cfg.policy == "weighted" and cfg.weights == {"queue": 1.0, "kv": 1.0, "prefix": 2.0}
    assert cfg.tokenizer == "byte" and cfg.prefix_block() == 16 and not cfg.flow_control
    flow = load_router_config(EXAMPLES / "router_flow.yaml")
    assert flow.flow_control and [b.label for b in flow.bands] == ["high", "low"]
    assert [(b.capacity, b.ttl) for b in flow.bands] == [(200, 30.0), (400, 120.0)]
    assert (flow.queue_threshold, flow.kv_threshold, flow.objectives["interactive"]) == (4, 0.9, 10)


def test_defaults_without_a_file():
    cfg = load_router_config(None)
    assert cfg == RouterConfig() and cfg.prefix_block() == 64 and cfg.refresh_interval <= 0.1


@pytest.mark.parametrize("doc,message", [
    ({"kind": "EndpointPickerConfig", "plugins": [{"type": "nope-scorer"}]}, "plugins[0].type"),
    ({"kind": "EndpointPickerConfig", "plugins": [{"type": "queue-scorer"}],
      "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "kv"}]}]}, "no plugin named 'kv'"),
    ({"kind": "EndpointPickerConfig", "saturationDetector": {"queueDepthThreshold": 0}},
     "saturationDetector.queueDepthThreshold"),
    ({"kind": "EndpointPickerConfig", "flowControl": {"priorityBands": [{"priority": 1, "ttl": "soon"}]}},
     "flowControl.priorityBands[0].ttl: not a duration"),
    ({"kind": "EndpointPickerConfig", "flowControl": {"priorityBands": [{"priority": 1}, {"priority": 1}]}},
     "priorities must be distinct"),
    ({"kind": "EndpointPickerConfig", "plugins": [{"type": "max-score-picker"}, {"type": "random-picker"}]},
     "one picker at most"),
    ({"kind": "Deployment"}, "kind"),
])
def test_errors_name_the_field(doc, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_router_config(doc)


def test_error_names_file_and_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("kind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n  parameters: 3\n")
    with pytest.raises(ValueError, match=r"r.yaml:4: plugins\[0\].parameters"):
        load_router_config(f)
    with pytest.raises(FileNotFoundError):
        load_router_config(tmp_path / "missing.yaml")


def test_pickers_map_to_the_simulator_policies():
    pairs = [("round-robin-picker", "round_robin"), ("prefix-affinity-picker", "prefix_affinity")]
    for picker, policy in pairs:
        cfg = load_router_config({"kind": "EndpointPickerConfig", "plugins": [{"type": picker}]})
        assert cfg.policy == policy


def test_session_affinity_scorer_reads_its_header():
    cfg = load_router_config({"kind": "EndpointPickerConfig", "plugins": [
        {"type": "session-affinity-scorer", "parameters": {"header": "X-User"}},
        {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "session-affinity-scorer", "weight": 3}, {"pluginRef": "max-score-picker"}]}]})
    assert cfg.session_header == "x-user" and cfg.weights == {"session": 3.0}
    assert RouterConfig().session_header == "x-session-id"


def test_durations():
    assert [seconds(v) for v in ("100ms", "5s", "2m", 1.5, "3")] == [0.1, 5.0, 120.0, 1.5, 3.0]


PAGE = """# HELP vllm:num_requests_running x
vllm:num_requests_running{engine="0",model_name="m1"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m1"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m1"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m1"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m1"} 0.25
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m1"} 4.0
"""


def test_read_gauges_sums_queues_and_averages_kv():
    gauges, models = read_gauges(PAGE)
    assert gauges == {"num_running": 3.0, "num_waiting": 8.0, "kv_usage": 0.375} and models == {"m1"}
    sglang, _ = read_gauges("sglang:num_queue_reqs 2\nsglang:token_usage 0.5\nsglang:num_running_reqs 4\n")
    assert sglang == {"num_waiting": 2.0, "kv_usage": 0.5, "num_running": 4.0}


def test_own_counts_move_the_waiting_estimate_between_scrapes():
    ep = Endpoint("http://e", 0)
    ep.outstanding = 5
    ep.scraped({"num_waiting": 2, "num_running": 3}, set(), outstanding_then=5, now=0.0)
    assert ep.num_waiting == 2
    ep.outstanding += 3  # sent since the scrape
    assert ep.num_waiting == 5
    ep.outstanding -= 8  # all finished
    assert ep.num_waiting == 0


def test_prompt_hashes_are_the_engines_block_hashes():
    text = "The same long system prompt. " * 8
    ids = ByteTokenizer(256).encode(text)
    hashes, n = PromptReader(ByteTokenizer(256), 16).read(text)
    assert n == len(ids) and hashes == prefix_hashes(ids, 16) and len(hashes) == len(ids) // 16
    chars, n_est = PromptReader(None, 64).read(text)
    assert len(chars) == len(text) // 64 and n_est > 0
    assert request_prompt({"prompt": [text]}, chat=False) == text
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert request_prompt({"messages": msgs}, chat=True) == chat_text(msgs) == "<|user|>\nhi\n<|assistant|>\n"


def test_example_scaledobject_reads_metrics_the_router_exports():
    from prometheus_client import generate_latest

    from autoscaler.spec import load_spec
    from controlplane.router.metrics import RouterMetrics
    from promql import compile_query
    from promql.tree import metric_names

    path = EXAMPLES / "router_scaledobject.yaml"
    spec = load_spec(path.read_text(), path=str(path))
    m = RouterMetrics()
    m.queue_size.labels("0", "default").set(0)
    m.inflight.labels("http://e").set(0)
    page = generate_latest(m.registry).decode()
    assert spec.min_replicas == 0
    for trigger in spec.doc["spec"]["triggers"]:
        for name in metric_names(compile_query(trigger["metadata"]["query"])):
            assert f"\n{name}{{" in page


def test_fleet_file_asks_for_the_router(tmp_path):
    from controlplane.fleet import load_fleet_config

    base = {"name": "f", "emulate": "h100-llama2-70b-tp4", "replicas": 1, "max_replicas": 2}
    assert load_fleet_config(base).router is None
    assert load_fleet_config({**base, "router": True}).router == RouterConfig()
    inline = {"kind": "EndpointPickerConfig", "plugins": [{"type": "round-robin-picker"}]}
    assert load_fleet_config({**base, "router": inline}).router.policy == "round_robin"
    (tmp_path / "r.yaml").write_text((EXAMPLES / "router_flow.yaml").read_text())
    (tmp_path / "fleet.yaml").write_text("name: f\nemulate: h100-llama2-70b-tp4\nrouter: r.yaml\n")
    assert load_fleet_config(tmp_path / "fleet.yaml").router.flow_control
    with pytest.raises(ValueError, match="router: no such router config file"):
        load_fleet_config({**base, "router": "missing.yaml"})
    with pytest.raises(ValueError, match=r"router.plugins\[0\].type"):
        load_fleet_config({**base, "router": {"kind": "EndpointPickerConfig", "plugins": [{"type": "x"}]}})


def test_scrape_query_asks_prometheus_client_for_the_gauges_read():
    from wsgiref.util import setup_testing_defaults

    from prometheus_client import CollectorRegistry, Gauge, Histogram, make_wsgi_app

    from controlplane.router.endpoints import METRICS_QUERY

    reg = CollectorRegistry()
    for name, value in [("vllm:num_requests_waiting", 4), ("vllm:num_requests_running", 2),
                        ("vllm:kv_cache_usage_perc", 0.5)]:
        Gauge(name, "x", ["model_name"], registry=reg).labels("m1").set(value)
    Histogram("vllm:time_to_first_token_seconds", "x", ["model_name"], registry=reg).labels("m1").observe(1)
    environ = {"QUERY_STRING": METRICS_QUERY}
    setup_testing_defaults(environ)
    page = b"".join(make_wsgi_app(reg)(environ, lambda status, headers: None)).decode()
    # the way vLLM serves /metrics: only the requested gauges come back, and they read in full
    assert "time_to_first_token" not in page
    assert read_gauges(page) == ({"num_waiting": 4.0, "num_running": 2.0, "kv_usage": 0.5}, {"m1"})
