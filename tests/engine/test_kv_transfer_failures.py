"""P/D failures leave nothing behind: a producer gone before or during the transfer (the consumer
computes the prompt itself, same tokens, its landing blocks freed), a consumer that never confirms
(the producer's lease expires), a request aborted while its pull is in flight."""

from __future__ import annotations

import socket
import threading
import time

import msgpack
import pytest

from engine.kv_transfer import wire
from tests.engine.engine_helpers import save_random_llama
from tests.engine.kv_transfer_helpers import connector, decode, engine, greedy, prefill, run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_random_llama(tmp_path_factory.mktemp("llama_pd_fail")))


IDS = list(range(3, 303))  # 300 tokens: 18 full blocks of 16


def cut_mid_payload_server() -> tuple[socket.socket, int]:
    """A producer that dies mid-transfer: it promises a payload and closes after 10 bytes."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            wire.recv(conn)
            wire.send(conn, {"op": "ok"})
            wire.recv(conn)
            head = msgpack.packb({"op": "data", "nbytes": 1 << 20})
            conn.sendall(len(head).to_bytes(4, "big") + head + b"x" * 10)

    threading.Thread(target=serve, daemon=True).start()
    return sock, sock.getsockname()[1]


def test_producer_gone_before_or_during_transfer(model_dir):
    agg, p, d = engine(model_dir, 16), engine(model_dir, 16), engine(model_dir, 16)
    want = run(agg, IDS, greedy(5), "a").output_token_ids
    pc, dc = connector(p, "kv_producer"), connector(d, "kv_consumer")
    params = prefill(p, pc, IDS, "r1")
    pc.close()  # the producer's channel is gone before the read
    seq, error = decode(d, dc, IDS, params, "r1", 5)
    assert error is None and seq.output_token_ids == want and seq.num_cached_tokens == 0
    fake, port = cut_mid_payload_server()
    with fake:
        seq, error = decode(d, dc, IDS, {**params, "remote_port": port}, "r2", 5)
    # r1 computed the prompt here, so r2 finds it in D's own prefix cache: nothing to move (the
    # confirmation alone failed)
    assert error is None and seq.output_token_ids == want and seq.num_cached_tokens == 288
    d2 = engine(model_dir, 16)
    dc2 = connector(d2, "kv_consumer")
    fake, port = cut_mid_payload_server()
    with fake:
        seq, error = decode(d2, dc2, IDS, {**params, "remote_port": port}, "r3", 5)
    assert error is None and seq.output_token_ids == want and seq.num_cached_tokens == 0
    assert dc.consumer.num_failed == 2 and dc2.consumer.num_failed == 1
    for e in (d, d2):
        assert e.block_manager.check_no_leak() == []


def test_unconfirmed_lease_expires_and_aborted_pull_frees(model_dir):
    p, d = engine(model_dir, 16), engine(model_dir, 16)
    pc, dc = connector(p, "kv_producer", lease_timeout_s=0.3), connector(d, "kv_consumer")
    try:
        params = prefill(p, pc, IDS, "r1")
        assert p.block_manager.usage > 0
        assert dc.on_add("r1", IDS, params, (IDS, greedy(5), "r1", None, 0))
        assert d.block_manager.usage > 0  # landing blocks taken
        assert dc.abort("r1")  # the client went away while the pull was in flight
        deadline = time.monotonic() + 10
        while dc.consumer.pulls and time.monotonic() < deadline:
            dc.tick()
            time.sleep(0.01)
        assert not d.scheduler.has_unfinished()  # never queued
        assert d.block_manager.check_no_leak() == []
        # the aborted pull still confirmed its read; a second lease nobody reads expires
        prefill(p, pc, [7] * 100, "r2")
        time.sleep(0.4)
        pc.tick()
        assert not pc.producer.leases and pc.producer.num_expired == 1
        assert p.block_manager.check_no_leak() == []
    finally:
        pc.close()
