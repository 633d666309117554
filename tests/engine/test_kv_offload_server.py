"""An emulated server with an offload tier: the flag reaches the engine through build_engine, and the
tier's hits show on /metrics under vLLM's names as the client's repeated prompts come back."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.args import EngineArgs
from engine.server import BackgroundServer, build_engine, build_server
from simulator.latency import load_latency_model


def test_emulated_server_reports_tier_hits():
    args = EngineArgs(num_kv_blocks=12, max_num_seqs=1, max_model_len=190, kv_offloading_size=1e-4)
    engine, name = build_engine(args, load_latency_model("cpu-tiny"))  # tiny's shape: 8 KiB a block
    tier = engine.block_manager.offload
    assert tier.block_bytes == 8192 and tier.num_slots == 13
    prompts = ["a" * 120, "b" * 180, "a" * 120]  # b fills the pool, evicting a's blocks; a comes back
    with BackgroundServer(build_server(engine, name)) as s:
        for p in prompts:
            r = httpx.post(s.url + "/v1/completions", json={"model": name, "prompt": p, "max_tokens": 2},
                           timeout=30)
            assert r.status_code == 200, r.text
        text = httpx.get(s.url + "/metrics").text
    values = {x.name: x.value for f in text_string_to_metric_families(text) for x in f.samples}
    bm = engine.block_manager
    assert bm.offload_hits > 0 and tier.loaded_blocks * 16 == bm.offload_hits
    assert values["vllm:external_prefix_cache_hits_total"] == bm.offload_hits
    assert values["vllm:external_prefix_cache_queries_total"] == bm.offload_queries
    assert values["vllm:kv_offload_load_bytes_total"] == tier.loaded_blocks * 8192
    assert values["slopilot:kv_offload_blocks"] == len(tier.index)
    info = [x.labels for f in text_string_to_metric_families(text) for x in f.samples
            if x.name == "vllm:cache_config_info"][0]
    assert (info["kv_offloading_size"], info["kv_offloading_backend"], info["num_cpu_blocks"]) == \
        ("0.0001", "native", "13")
