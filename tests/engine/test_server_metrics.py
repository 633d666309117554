"""/metrics: vLLM's names, types, labels and buckets, parsed with prometheus_client's own parser;
the counters and histograms move with the requests the client saw complete."""

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.args import EngineArgs
from engine.metrics import buckets_1_2_5
from engine.server import BackgroundServer, build_engine, build_server
from simulator.latency import load_latency_model

MAX_MODEL_LEN = 512
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
        40.0, 80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
       80.0]
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
           480.0, 960.0, 1920.0, 7680.0]
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500]  # the 1-2-5 series up to max_model_len 512

EXPECTED = {  # family name as the parser reports it (counters without _total) -> (type, buckets)
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:cache_config_info": ("gauge", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", LATENCY),
    "vllm:request_queue_time_seconds": ("histogram", LATENCY),
    "vllm:request_prefill_time_seconds": ("histogram", LATENCY),
    "vllm:request_decode_time_seconds": ("histogram", LATENCY),
    "vllm:request_prompt_tokens": ("histogram", TOKENS),
    "vllm:request_generation_tokens": ("histogram", TOKENS),
}


@pytest.fixture(scope="module", params=["real", "emulated"])
def server(request):
    if request.param == "real":
        engine, name = build_engine(EngineArgs("tiny", max_model_len=MAX_MODEL_LEN))
    else:
        engine, name = build_engine(EngineArgs(max_model_len=MAX_MODEL_LEN), load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name)) as s:
        s.model = name
        yield s


def scrape(url: str) -> dict:
    text = httpx.get(url + "/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    fam = families[name]
    sample = sample or name
    hits = [s.value for s in fam.samples if s.name == sample and all(s.labels.get(k) == v
                                                                      for k, v in labels.items())]
    assert len(hits) == 1, (name, sample, labels, fam.samples)
    return hits[0]


def test_buckets_1_2_5():
    assert buckets_1_2_5(512) == TOKENS
    assert buckets_1_2_5(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert buckets_1_2_5(1) == [1]


def test_every_name_type_label_and_bucket(server):
    families = scrape(server.url)
    for name, (kind, buckets) in EXPECTED.items():
        assert name in families, name
        fam = families[name]
        assert fam.type == kind, (name, fam.type)
        for s in fam.samples:
            assert s.labels["engine"] == "0", (name, s)
            if name != "vllm:cache_config_info":
                assert s.labels["model_name"] == server.model, (name, s)
        if buckets is not None:
            les = [float(s.labels["le"]) for s in fam.samples if s.name == name + "_bucket"]
            assert les == [*buckets, float("inf")], name
    info = [s for s in families["vllm:cache_config_info"].samples if s.name == "vllm:cache_config_info"]
    assert info[0].value == 1 and info[0].labels["block_size"] == "16"
    assert int(info[0].labels["num_gpu_blocks"]) > 0
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    # counters appear on the wire with the _total suffix, as vLLM's do
    assert any(s.name == "vllm:generation_tokens_total" for s in families["vllm:generation_tokens"].samples)


def test_name_filter_renders_only_the_series_asked_for(server):
    full = httpx.get(server.url + "/metrics").text
    wanted = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
    text = httpx.get(server.url + "/metrics", params=[("name[]", n) for n in wanted]).text
    assert {f.name for f in text_string_to_metric_families(text)} == set(wanted)
    assert len(text) < len(full) / 10
    counter = httpx.get(server.url + "/metrics", params={"name[]": "vllm:generation_tokens_total"}).text
    assert [f.name for f in text_string_to_metric_families(counter)] == ["vllm:generation_tokens"]


def test_counters_and_histograms_follow_the_requests(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    before = scrape(server.url)
    prompt = "a prompt long enough to fill two whole KV blocks of sixteen tokens"
    usages = []
    for i in range(3):
        r = c.completions.create(model=server.model, prompt=prompt, max_tokens=5 + i,
                                 extra_body={"ignore_eos": True})
        usages.append(r.usage)
    stream = c.completions.create(model=server.model, prompt="short", max_tokens=4, stream=True,
                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    usages.append(list(stream)[-1].usage)
    after = scrape(server.url)

    def delta(name, sample=None, **labels):
        return value(after, name, sample, **labels) - value(before, name, sample, **labels)

    gen = sum(u.completion_tokens for u in usages)
    assert gen == 5 + 6 + 7 + 4
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == gen
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 4
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens"):
        assert delta(name, name + "_count") == 4, name
    assert delta("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == gen - 4
    assert delta("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == gen
    assert delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum") > 0
    # the same prompt three times: two whole blocks hit the prefix cache on each repeat
    assert delta("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == \
        sum(u.prompt_tokens for u in usages)
    assert delta("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") >= 2 * 2 * 16
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0


def test_preemptions_are_counted():
    # a pool of 8 blocks: two requests that each grow to 5 blocks cannot both stay
    engine, name = build_engine(EngineArgs(num_kv_blocks=8, max_model_len=128, max_num_seqs=4),
                                load_latency_model("cpu-tiny"))
    with BackgroundServer(build_server(engine, name)) as s:
        async def main():
            c = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
            return await asyncio.gather(*(c.completions.create(model=name, prompt="p" * 20 + str(i),
                                                               max_tokens=60) for i in range(2)))

        results = asyncio.run(main())
        assert [r.usage.completion_tokens for r in results] == [60, 60]
        families = scrape(s.url)
        assert value(families, "vllm:num_preemptions", "vllm:num_preemptions_total") >= 1
        assert value(families, "vllm:kv_cache_usage_perc") == 0.0
