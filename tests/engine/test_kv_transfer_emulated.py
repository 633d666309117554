"""Emulated P/D: `serve --emulate` engines take the same roles and protocol; no KV moves, the pull takes
latency + bytes / bandwidth, the bytes from the model's KV bytes per token. An emulated engine never
pairs with a real one (refused at the handshake)."""

from __future__ import annotations

import httpx
import pytest

from engine.args import EngineArgs
from engine.kv_transfer import parse_kv_transfer_config
from engine.kv_transfer.wire import layout_mismatch
from engine.server import build_engine, build_server
from engine.server.run import BackgroundServer
from simulator.latency import load_latency_model
from tests.server_helpers import CMPL, metric, wait_for

MODEL = "llama-3.1-70b@h100-sxm-tp4-bf16"  # derived: 327,680 KV bytes per token
LINK = {"bandwidth_gbs": 2.0, "latency_ms": 40.0}


def emulated(role: str, extra: dict) -> BackgroundServer:
    cfg = parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": role,
                                    "kv_connector_extra_config": extra})
    eng, name = build_engine(EngineArgs(block_size=16, num_kv_blocks=512), load_latency_model(MODEL))
    return BackgroundServer(build_server(eng, name, kv_transfer=cfg))


def test_emulated_pair_times_the_transfer():
    extra = {"kv_bytes_per_token": 327680, "link": LINK}
    ids = [3 + i % 500 for i in range(400)]  # 400 tokens: 24 full blocks move
    with emulated("kv_producer", extra) as p, emulated("kv_consumer", extra) as d:
        first = httpx.post(p.url + CMPL, json={"prompt": ids, "max_tokens": 1, "kv_transfer_params":
                                               {"do_remote_decode": True}}, timeout=60)
        kv = first.json()["kv_transfer_params"]
        assert kv["dtype"] == "emulated" and len(kv["remote_block_ids"]) == 24
        r = httpx.post(d.url + CMPL, json={"prompt": ids, "max_tokens": 3, "ignore_eos": True,
                                           "kv_transfer_params": kv}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        moved = 24 * 16 * 327680
        assert metric(d.url, "vllm:nixl_bytes_transferred_sum") == moved
        modelled = LINK["latency_ms"] / 1e3 + moved / (LINK["bandwidth_gbs"] * 1e9)  # 0.166 s
        took = metric(d.url, "vllm:nixl_xfer_time_seconds_sum")
        assert modelled <= took < modelled + 1.0, (took, modelled)
        assert metric(d.url, "vllm:prefix_cache_hits_total") == 24 * 16  # landed as cached blocks
        assert wait_for(lambda: metric(p.url, "vllm:kv_cache_usage_perc") == 0.0
                        and metric(d.url, "vllm:kv_cache_usage_perc") == 0.0)


def test_emulated_and_real_never_pair():
    real = {"block_size": 16, "dtype": "float32", "num_layers": 2, "num_kv_heads": 2, "head_dim": 16}
    fake = {"block_size": 16, "dtype": "emulated", "kv_bytes_per_token": 327680.0}
    assert "dtype 'emulated' (consumer) vs 'float32' (producer)" in layout_mismatch(real, fake)
    assert layout_mismatch(fake, dict(fake)) is None


def test_emulated_needs_bytes_per_token_and_a_known_link():
    with pytest.raises(ValueError, match="link must be one of"):
        parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": "kv_both",
                                  "kv_connector_extra_config": {"link": "carrier-pigeon"}})
    cfg = parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": "kv_both",
                                    "kv_connector_extra_config": {"link": "tcp"}})
    eng, _ = build_engine(EngineArgs(num_kv_blocks=64), load_latency_model("h100-llama2-70b-tp4"))
    with pytest.raises(ValueError, match="KV bytes per token"):
        build_server(eng, "m", kv_transfer=cfg)


def test_a_real_producer_paces_its_payload_when_asked():
    import socket
    import threading
    import time

    from engine.kv_transfer import wire

    cfg = parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"send_bandwidth_gbs": 0.001}})
    assert cfg.send_bytes_per_s == 1e6
    with pytest.raises(ValueError, match="send_bandwidth_gbs must be a number > 0"):
        parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": "kv_producer",
                                  "kv_connector_extra_config": {"send_bandwidth_gbs": 0}})
    a, b = socket.socketpair()
    payload = bytes(range(256)) * 1024  # 256 kB at 1 MB/s: at least 0.25 s
    got = {}
    reader = threading.Thread(target=lambda: got.update(msg=wire.recv(b)))
    reader.start()
    t0 = time.monotonic()
    wire.send(a, {"op": "data"}, payload, cfg.send_bytes_per_s)
    reader.join(10)
    assert time.monotonic() - t0 >= 0.24
    assert got["msg"][0]["op"] == "data" and bytes(got["msg"][1]) == payload
    a.close()
    b.close()
