"""P/D over HTTP with vLLM's kv_transfer_params: the two-hop flow, a lease that ends unread at its
timeout (KV usage back to idle), a block-size mismatch refused at the handshake, role errors."""

from __future__ import annotations

import random

import httpx
import pytest

from engine.args import EngineArgs
from engine.kv_transfer import parse_kv_transfer_config
from engine.server import build_engine, build_server
from engine.server.run import BackgroundServer
from tests.engine.engine_helpers import save_random_llama
from tests.server_helpers import CMPL, assert_error, metric, wait_for

MAX_TOKENS = 5
PREFILL = {"do_remote_decode": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_random_llama(tmp_path_factory.mktemp("llama_pd_http"), max_position_embeddings=4096))


def server(model: str, role: str | None, block_size: int = 16, lease_timeout_s: float = 60.0):
    cfg = None if role is None else parse_kv_transfer_config(
        {"kv_connector": "NixlConnector", "kv_role": role,
         "kv_connector_extra_config": {"lease_timeout_s": lease_timeout_s}})
    eng, name = build_engine(EngineArgs(model=model, block_size=block_size, num_kv_blocks=256))
    return BackgroundServer(build_server(eng, "m", kv_transfer=cfg))


def body(ids: list[int], **extra) -> dict:
    return {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **extra}


def kv_usage(url: str) -> float:
    return metric(url, "vllm:kv_cache_usage_perc")


def test_two_hops_match_aggregated_and_free_everything(model_dir):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 40, 600)]
    with server(model_dir, "kv_producer") as p, server(model_dir, "kv_consumer") as d, \
            server(model_dir, None) as a:
        for ids in prompts:
            want = httpx.post(a.url + CMPL, json=body(ids), timeout=60).json()
            first = httpx.post(p.url + CMPL, json=body(ids, max_tokens=1,
                                                       kv_transfer_params={"do_remote_decode": True}),
                               timeout=60).json()
            kv = first["kv_transfer_params"]
            assert kv["do_remote_prefill"] and kv["remote_port"] > 0
            assert len(kv["remote_block_ids"]) == (len(ids) - 1) // 16
            got = httpx.post(d.url + CMPL, json=body(ids, kv_transfer_params=kv), timeout=60).json()
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
            assert got["usage"] == want["usage"]
            assert "kv_transfer_params" not in want  # plain answers keep their shape
        # the consumer confirmed every read: the producer's leases ended, both pools are idle
        assert wait_for(lambda: kv_usage(p.url) == 0.0 and kv_usage(d.url) == 0.0)
        assert metric(d.url, "vllm:nixl_xfer_time_seconds_count") == 3  # the 1-token one: handshake only
        moved = (39 // 16 + 599 // 16) * 16 * 2 * 2 * 2 * 16 * 4  # tokens x layers x K,V x heads x dim x 4 B
        assert metric(d.url, "vllm:nixl_bytes_transferred_sum") == moved
        assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == 0
        assert metric(p.url, "slopilot:kv_transfer_role_info", kv_role="kv_producer") == 1


def test_unread_lease_is_freed_at_its_timeout(model_dir):
    ids = list(range(3, 203))  # 200 tokens: 12 full blocks leased
    with server(model_dir, "kv_producer", lease_timeout_s=1.0) as p:
        assert kv_usage(p.url) == 0.0
        r = httpx.post(p.url + CMPL, json=body(ids, max_tokens=1, kv_transfer_params=PREFILL), timeout=60)
        assert len(r.json()["kv_transfer_params"]["remote_block_ids"]) == 12
        assert kv_usage(p.url) == pytest.approx(12 / 256)  # held by the lease
        assert metric(p.url, "slopilot:kv_transfer_leased_blocks") == 12
        assert wait_for(lambda: kv_usage(p.url) == 0.0, timeout=5.0)  # no consumer ever came
        assert metric(p.url, "vllm:nixl_num_kv_expired_reqs_total") == 1


def test_block_size_mismatch_refused_at_handshake(model_dir):
    ids = list(range(3, 103))
    with server(model_dir, "kv_producer", block_size=16, lease_timeout_s=1.0) as p, \
            server(model_dir, "kv_consumer", block_size=32) as d:
        kv = httpx.post(p.url + CMPL, json=body(ids, max_tokens=1, kv_transfer_params=PREFILL),
                        timeout=60).json()["kv_transfer_params"]
        err = assert_error(httpx.post(d.url + CMPL, json=body(ids, kv_transfer_params=kv), timeout=60), 400)
        assert "block_size 32 (consumer) vs 16 (producer)" in err["message"], err
        assert wait_for(lambda: kv_usage(d.url) == 0.0 and kv_usage(p.url) == 0.0, timeout=5.0)


def test_role_errors_are_400(model_dir):
    with server(model_dir, "kv_consumer") as d, server(model_dir, None) as a:
        remote = {"do_remote_decode": True}
        assert "cannot serve do_remote_decode" in assert_error(
            httpx.post(d.url + CMPL, json=body([5, 6], kv_transfer_params=remote)), 400)["message"]
        assert "no --kv-transfer-config" in assert_error(
            httpx.post(a.url + CMPL, json=body([5, 6], kv_transfer_params=remote)), 400)["message"]
        bad = {"do_remote_prefill": True, "remote_host": "127.0.0.1"}
        assert "remote_port" in assert_error(
            httpx.post(d.url + CMPL, json=body([5, 6], kv_transfer_params=bad)), 400)["message"]


def test_bad_config_named():
    for text, needle in [("{", "not valid JSON"),
                         ('{"kv_connector": "X", "kv_role": "kv_both"}', "kv_connector"),
                         ('{"kv_connector": "TcpConnector", "kv_role": "prefill"}', "kv_role")]:
        with pytest.raises(ValueError, match=needle):
            parse_kv_transfer_config(text)
