"""KV events: vLLM's wire format, our engine's events through our subscriber into the precise index,
sequence gaps (replay, resync, restart), the precise scorer's ranking, and bad --kv-events-config."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from engine.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    decode_batch,
    encode_batch,
    seq_bytes,
)
from engine.kv_events import KVEvents, ZmqPublisher, parse_kv_events_config
from routing.kv_index import KVBlockIndex
from routing.kv_subscriber import KVEventSubscriber, llmd_topic_key
from routing.prefix import prefix_hashes
from routing.router import Router

# vLLM 0.32's msgspec encoding of KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"ab", 5],
# parent_block_hash=None, token_ids=[1, 2], block_size=16, lora_id=None, medium="GPU", lora_name=None),
# BlockRemoved(block_hashes=[b"ab"], medium="GPU"), AllBlocksCleared()]), taken from vLLM itself
VLLM_BYTES = bytes.fromhex(
    "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c4"
    "02616205b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73"
    "697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c"
    "6f636b52656d6f766564ac626c6f636b5f68617368657391c4026162a66d656469756da347505581a4747970"
    "65b0416c6c426c6f636b73436c6561726564c0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_bytes_decode_and_our_encoding_is_identical():
    batch = decode_batch(VLLM_BYTES)
    assert batch.ts == 1.5 and batch.data_parallel_rank is None
    stored, removed, cleared = batch.events
    assert stored == BlockStored([b"ab", 5], None, [1, 2], 16, "GPU")
    assert removed == BlockRemoved([b"ab"], "GPU") and isinstance(cleared, AllBlocksCleared)
    assert encode_batch(batch) == VLLM_BYTES


def test_array_form_and_bad_payloads():
    import msgpack

    old = msgpack.packb([2.0, [["BlockStored", [7], None, [1] * 4, 4, None, "GPU", None],
                               ["BlockRemoved", [7], "CPU"], ["AllBlocksCleared"]]])
    ev = decode_batch(old).events
    assert ev[0].block_hashes == [7] and ev[0].block_size == 4 and ev[1].medium == "CPU"
    for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, [{"type": "Nope"}]]),
                msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": "x", "token_ids": [],
                                      "block_size": 16}]])):
        with pytest.raises(DecodeError):
            decode_batch(bad)


@pytest.fixture
def llm():
    from engine import LLM

    return LLM("tiny", max_num_seqs=8, num_kv_blocks=24, block_size=16, max_num_batched_tokens=256)


def wait_for(sub: KVEventSubscriber, cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.05)  # the subscriber's thread reads
    assert cond()


def test_engine_events_round_trip_into_the_index(llm):
    from engine import SamplingParams

    port = free_port()
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}",
                                  "topic": "kv@engine-a@tiny"})
    assert cfg.publisher == "zmq"  # vLLM's default when events are on
    sub = KVEventSubscriber(KVBlockIndex(block_size=16))
    sub.bind(f"tcp://127.0.0.1:{port}")  # the engine connects (vLLM's rule: no wildcard -> connect)
    sub.start()
    events = KVEvents(llm.engine, cfg)
    try:
        time.sleep(0.3)  # ZMQ's slow joiner: the subscription reaches the publisher
        bm, params = llm.engine.block_manager, SamplingParams(temperature=0, max_tokens=8)
        prompts = [[1 + (i * 7 + j) % 200 for j in range(40 + 9 * i)] for i in range(12)]
        llm.generate(prompts[:2], params)
        wait_for(sub, lambda: sub.index.blocks("engine-a") == len(bm.cached))
        assert set(sub.index._eps["engine-a"].media) == set(bm.cached)  # the very hashes the engine uses
        assert sub.index._eps["engine-a"].native is True
        # the index finds a prompt's blocks by the router's own hashes of its tokens
        assert len(sub.index.match("engine-a", prefix_hashes(prompts[1], 16))) == 40 // 16 + 1
        llm.generate(prompts, params)  # 24 blocks cannot hold them all: evictions, BlockRemoved
        wait_for(sub, lambda: sub.last_seq.get("engine-a") == events.publisher._seq - 1)
        assert set(sub.index._eps["engine-a"].media) == set(bm.cached)
        assert sub.stats.gaps == 0 and sub.stats.bad == 0 and sub.stats.events > 10
    finally:
        events.close()
        sub.close()


def test_offload_tier_blocks_are_published_under_their_medium(llm):
    from engine import SamplingParams
    from engine.kv_offload import build_tier

    bm, runner = llm.engine.block_manager, llm.engine.runner
    bm.offload = build_tier(40 * runner.kv_block_bytes / 2**30, runner)  # 40 host-memory blocks
    port = free_port()
    sub = KVEventSubscriber(KVBlockIndex(block_size=16))
    sub.connect("e", f"tcp://127.0.0.1:{port}")
    sub.start()
    events = KVEvents(llm.engine, parse_kv_events_config(
        {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}".replace("127.0.0.1", "*")}))
    try:
        time.sleep(0.3)
        params = SamplingParams(temperature=0, max_tokens=4)
        prompts = [[1 + (i * 7 + j) % 200 for j in range(40 + 9 * i)] for i in range(10)]
        llm.generate(prompts, params)
        llm.generate(prompts, params)  # the early ones come back from the tier
        assert bm.offload_hits > 0 and len(bm.offload.index) > 0
        wait_for(sub, lambda: sub.last_seq.get("e") == events.publisher._seq - 1)
        media = sub.index._eps["e"].media
        assert {k for k, m in media.items() if "GPU" in m} == set(bm.cached)
        assert {k for k, m in media.items() if "CPU" in m} == set(bm.offload.index.hashes())
        assert sub.index.orphans == 0 and sub.stats.gaps == 0
    finally:
        events.close()
        sub.close()


def stored_batch(hashes: list[int], parent=None) -> EventBatch:
    return EventBatch(0.0, [BlockStored(hashes, parent, [0] * 16 * len(hashes), 16)])


def frames(seq: int, batch: EventBatch, topic: bytes = b"t") -> list[bytes]:
    return [topic, seq_bytes(seq), encode_batch(batch)]


def test_gap_is_replayed_from_the_engine_buffer():
    port, rport = free_port(), free_port()
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}",
                                  "replay_endpoint": f"tcp://*:{rport}"})
    pub = ZmqPublisher(cfg)  # batch 0: AllBlocksCleared
    index = KVBlockIndex(16)
    sub = KVEventSubscriber(index)
    try:
        for i in range(1, 4):  # batches 1..3: one block each, chained
            pub.publish(stored_batch([100 + i], 100 + i - 1 if i > 1 else None).events)
        time.sleep(0.3)  # sent and buffered
        replay = f"tcp://127.0.0.1:{rport}"
        sub.handle(frames(0, EventBatch(0.0, [AllBlocksCleared()])), "e", replay)
        sub.handle(frames(3, stored_batch([103], 102)), "e", replay)  # 1 and 2 were lost
        assert sub.stats.gaps == 2 and sub.stats.replayed == 2 and sub.stats.resyncs == 0
        assert sub.last_seq["e"] == 3
        assert index.blocks("e") == 3 and set(index._eps["e"].keys) == {101, 102, 103}
        # a gap the buffer cannot fill (the engine never sent 10..19): resync, the stale blocks forgotten
        sub.handle(frames(20, stored_batch([555])), "e", replay)
        assert sub.stats.resyncs == 1 and index.blocks("e") == 1
    finally:
        pub.close()
        sub.close()


def test_gap_without_replay_resyncs_restart_clears_duplicates_dropped():
    index = KVBlockIndex(16)
    sub = KVEventSubscriber(index)
    sub.handle(frames(0, stored_batch([1, 2])))
    assert index.blocks("t") == 2
    sub.handle(frames(0, stored_batch([1, 2])))  # seq 0 again: a restarted engine
    assert sub.stats.resyncs == 1 and index.blocks("t") == 2
    sub.handle(frames(1, stored_batch([3])))
    sub.handle(frames(1, stored_batch([3])))
    assert sub.stats.duplicates == 1
    sub.handle(frames(5, stored_batch([9])))  # 2..4 lost, nowhere to replay them from
    assert sub.stats.gaps == 3 and sub.stats.resyncs == 2 and index.blocks("t") == 1
    sub.handle([b"t", b"short", b""])
    assert sub.stats.bad == 1
    sub.handle(frames(6, EventBatch(0.0, [AllBlocksCleared()])))
    assert index.blocks("t") == 0
    sub.close()


def test_translated_hashes_and_media():
    """An engine with its own hashes (vLLM's): keys computed from parents and tokens; CPU tier kept apart."""
    index = KVBlockIndex(4)
    toks = list(range(12))
    index.apply("v", [BlockStored([b"h1", b"h2"], None, toks[:8], 4),
                      BlockStored([b"h3"], b"h2", toks[8:], 4),
                      BlockStored([b"h1"], None, toks[:4], 4, "CPU")])
    keys = prefix_hashes(toks, 4)
    assert index.match("v", keys) == ["GPU", "GPU", "GPU"]
    index.apply("v", [BlockRemoved([b"h1"], "GPU")])
    assert index.match("v", keys) == ["CPU", "GPU", "GPU"]
    index.apply("v", [BlockStored([b"zz"], b"unknown", toks[:4], 4), BlockStored([9], None, toks[:8], 4)])
    assert index.orphans == 1 and index.malformed == 1
    assert llmd_topic_key("kv@10.0.0.7@llama") == "10.0.0.7" and llmd_topic_key("plain") == "plain"


class Rep:
    def __init__(self, i):
        self.id, self.num_waiting, self.num_running, self.outstanding, self.kv_usage = i, 0, 0, 0, 0.1


def test_precise_scorer_ranks_device_over_offload_over_partial():
    toks = list(range(64))
    keys = prefix_hashes(toks, 16)
    index = KVBlockIndex(16)
    index.store_keys(0, keys[:2])  # half the prompt on the device
    index.store_keys(1, keys, "CPU")  # all of it in host memory
    index.store_keys(2, keys)  # all of it on the device
    scores = [index.score(i, keys) for i in range(4)]
    assert scores == [0.5, 0.8, 1.0, 0.0]
    router = Router("weighted", {"precise_prefix": 1.0}, block_tokens=16)
    router.kv_index = index
    reps = [Rep(i) for i in range(4)]
    assert router.pick(reps, toks) == 2
    index.remove_keys(2, keys[1:])  # the device copy mostly evicted
    assert router.pick(reps, toks) == 1
    router.kv_index = None  # no index: every endpoint scores 0, the pick still works
    assert router.pick(reps, toks) in range(4)


@pytest.mark.parametrize("text, words", [
    ("{nope", "not valid JSON"),
    ('{"publisher": "kafka", "enable_kv_cache_events": true}', "publisher must be 'zmq' or 'null'"),
    ('{"enable_kv_cache_events": true, "endpoint": "localhost:5557"}', "endpoint must be a ZMQ address"),
    ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps must be >= 1"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events has the wrong type"),
    ('{"endpoints": "tcp://*:1"}', "unknown field 'endpoints'"),
    ("[1]", "must be a JSON object"),
])
def test_bad_kv_events_config(text, words):
    with pytest.raises(ValueError, match="--kv-events-config") as err:
        parse_kv_events_config(text)
    assert words in str(err.value)


def test_serve_rejects_a_bad_kv_events_config_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "slopilot.cli", "serve", "tiny", "--kv-events-config",
                        '{"publisher": "kafka"}'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--kv-events-config: publisher must be 'zmq' or 'null'" in r.stderr
    assert "Traceback" not in r.stderr


def precise_config(params: dict) -> dict:
    return {"kind": "EndpointPickerConfig", "plugins": [
        {"type": "precise-prefix-cache-scorer", "parameters": params}, {"type": "max-score-picker"}]}


def test_router_config_selects_the_precise_scorer_and_checks_its_parameters():
    from controlplane.router.precise import endpoint_key, kv_feed
    from routing.config import load_router_config
    from routing.router import Router

    params = {"blockSize": 16, "tokenizer": "byte", "mediumWeights": {"CPU": 0.5}, "zmqEndpoint": "tcp://127.0.0.1:0"}
    cfg = load_router_config(precise_config(params))
    assert cfg.weights == {"precise_prefix": 1.0} and cfg.prefix_block() == 16
    assert cfg.kv_events_endpoint == "tcp://127.0.0.1:0" and cfg.kv_medium_weights == {"CPU": 0.5}
    router = Router(cfg.policy, cfg.weights, block_tokens=cfg.prefix_block())
    sub = kv_feed(cfg, router)
    try:
        assert router.kv_index is sub.index and router.uses_prefix
    finally:
        sub.close()
    assert endpoint_key("kv@127.0.0.1:8001@tiny") == "http://127.0.0.1:8001"
    assert load_router_config(precise_config({})).prefix_block() == 16
    for params, field in (({"zmqEndpoint": "localhost:1"}, "zmqEndpoint"),
                          ({"mediumWeights": {"CPU": 2}}, "mediumWeights"), ({"lru": 1}, "lru")):
        with pytest.raises(ValueError, match=field):
            load_router_config(precise_config(params))


def test_blocks_without_tokens_go_as_placeholders_and_a_native_index_keeps_them():
    from engine.core.block_manager import BlockManager
    from engine.kv_events import EventRecorder

    bm = BlockManager(8, 4)
    rec = bm.listener = EventRecorder(4)
    bm.register(3, 12345)  # a block landed from a prefill engine: hash only
    (placeholder,) = rec.take()
    assert placeholder == BlockStored([12345], None, [], 0, "GPU")
    assert decode_batch(encode_batch(EventBatch(0.0, [placeholder]))).events == [placeholder]
    index = KVBlockIndex(4)
    toks = [5, 6, 7, 8]
    index.apply("ours", [BlockStored(prefix_hashes(toks, 4), None, toks, 4), placeholder])
    assert index.blocks("ours") == 2 and index.orphans == 0  # native hashes: kept as they are
    index.apply("theirs", [BlockStored([b"x"], None, toks, 4), placeholder])
    assert index.blocks("theirs") == 1 and index.orphans == 1  # foreign hashes: no key without tokens


def test_an_endpoint_that_leaves_the_pool_leaves_the_index():
    from controlplane.router.app import build_router_app
    from routing.config import load_router_config

    cfg = load_router_config(precise_config({"zmqEndpoint": "tcp://127.0.0.1:0"}))
    urls = ["http://127.0.0.1:9"]
    st = build_router_app(cfg, lambda: list(urls)).st
    try:
        st.pool.sync(urls)
        st.kv_events.index.store_keys("http://127.0.0.1:9", [1, 2, 3])
        st.pool.sync([])
        assert st.kv_events.index.endpoints() == []
    finally:
        st.kv_events.close()


def test_a_subscriber_past_the_replay_buffer_gets_a_full_re_read(llm):
    from engine import SamplingParams

    port, rport = free_port(), free_port()
    events = KVEvents(llm.engine, parse_kv_events_config(
        {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{rport}",
         "buffer_steps": 2}))
    sub = KVEventSubscriber(KVBlockIndex(block_size=16))
    try:
        bm, params = llm.engine.block_manager, SamplingParams(temperature=0, max_tokens=4)
        for p in ([1 + (j * 3) % 200 for j in range(70)], [9] * 50, [11] * 33):  # before anyone listens
            llm.generate([p], params)
        seen_before = set(bm.cached)
        assert len(seen_before) >= 5 and events.publisher._seq > 3  # more batches than the buffer keeps
        sub.connect("e", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
        sub.start()
        time.sleep(0.3)
        llm.generate([[7] * 40], params)  # its first batch: seen late, the replay cannot fill 0..n
        wait_for(sub, lambda: events.publisher.snapshot_wanted or sub.stats.batches > 1)
        llm.generate([[8] * 20], params)  # the next step sends the full re-read
        wait_for(sub, lambda: sub.last_seq.get("e") == events.publisher._seq - 1)
        assert set(sub.index._eps["e"].media) == set(bm.cached) >= seen_before
    finally:
        events.close()
        sub.close()
