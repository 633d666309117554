"""A real vLLM's KV events, decoded by our subscriber: the precise index agrees with vLLM's prefix cache.

`vllm serve` (the CPU build in .venv-vllm, `make vllm`) runs with `--kv-events-config` publishing to a
SUB socket our subscriber binds (vLLM connects when the endpoint has no wildcard, as llm-d sets it
up) and a replay socket. For each probe prompt the index predicts how many leading blocks vLLM holds
(from its BlockStored / BlockRemoved events, keyed by our own hash of the tokens: vLLM's hashes are
its own), and vLLM's `vllm:prefix_cache_hits_total` counts the tokens it then finds cached: they
must agree, block for block, on prompts it has seen, half seen, and never seen.
"""

from __future__ import annotations

import json
import random
import re
import time

import httpx
import pytest

from routing.kv_index import KVBlockIndex
from routing.kv_subscriber import KVEventSubscriber
from routing.prefix import prefix_hashes
from tests.e2e.conftest import VLLM_MODEL, VllmServer, free_port, skip_without_vllm, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

KEY = "vllm-a"
HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\}\s+(\S+)", re.M)


@pytest.fixture(scope="module")
def vllm_with_events():
    skip_without_vllm()
    port, replay = free_port(), free_port()
    sub = KVEventSubscriber(KVBlockIndex())  # no block size given: vLLM's is read from its events
    sub.bind(f"tcp://127.0.0.1:{port}")
    sub.set_replay(KEY, f"tcp://127.0.0.1:{replay}")
    sub.start()
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}",
           "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": f"kv@{KEY}@{VLLM_MODEL}"}
    server = VllmServer("--kv-events-config", json.dumps(cfg), log_name="vllm-serve-kv-events.log")
    try:
        server.wait_ready()
        yield server, sub, f"tcp://127.0.0.1:{replay}"
    finally:
        server.stop()
        server.log.close()
        sub.close()


def hits(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    return sum(float(v) for v in HITS.findall(text))


def complete(url: str, prompt: list[int]) -> None:
    r = httpx.post(url + "/v1/completions", timeout=120, trust_env=False,
                   json={"model": VLLM_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text


def test_index_from_vllm_events_predicts_vllm_prefix_hits(vllm_with_events):
    server, sub, replay = vllm_with_events
    rng = random.Random(7)
    index = sub.index
    warm = [rng.randrange(3, 2000) for _ in range(300)]
    complete(server.url, warm)  # the first request: learns vLLM's block size from its events
    wait_for(lambda: index.endpoints(), 30, what="a KV event batch from vLLM")
    ep = index._eps[KEY]
    stored = wait_for(lambda: ep.keys and len(ep.keys), 30, what="BlockStored events")
    assert ep.native is False  # vLLM's hashes are not ours: keys come from parents and tokens
    bs = next(b for b in (16, 32, 64, 128, 256) if prefix_hashes(warm, b)
              and index.match(KEY, prefix_hashes(warm, b)))
    assert stored >= len(warm) // bs

    base = [rng.randrange(3, 2000) for _ in range(6 * bs + 5)]
    half = base[:3 * bs] + [rng.randrange(3, 2000) for _ in range(3 * bs + 5)]
    fresh = [rng.randrange(3, 2000) for _ in range(4 * bs + 3)]
    complete(server.url, base)
    # the events of that request have arrived once the index holds its blocks
    wait_for(lambda: len(index.match(KEY, prefix_hashes(base, bs))) == 6, 30, what="base's blocks indexed")
    rows = []
    for name, prompt in (("identical", base), ("half shared", half), ("never seen", fresh)):
        predicted = len(index.match(KEY, prefix_hashes(prompt, bs)))
        predicted = min(predicted, (len(prompt) - 1) // bs)  # vLLM computes the last token anyway
        before = hits(server.url)
        complete(server.url, prompt)
        time.sleep(1.0)  # the counter is updated with the step's stats
        found = (hits(server.url) - before) / bs
        rows.append((name, predicted, found))
    print(f"vLLM block size {bs}; (probe, index-predicted blocks, vLLM cached blocks): {rows}; "
          f"subscriber {sub.stats}")
    assert rows == [("identical", 6, 6), ("half shared", 3, 3), ("never seen", 0, 0)]
    assert sub.stats.bad == 0 and index.orphans == 0 and index.mismatched == 0
    media = {m for held in index._eps[KEY].media.values() for m in held}
    assert media == {"GPU"}  # vLLM names its own KV pool GPU, on the CPU build too
    # vLLM's replay socket: a subscriber that heard nothing asks for every batch from 0 and rebuilds
    # the same index
    late = KVEventSubscriber(KVBlockIndex())
    try:
        assert late._replay(KEY, replay, 0, sub.last_seq[KEY] + 1)
        assert late.stats.replayed == sub.last_seq[KEY] + 1
        assert late.index._eps[KEY].media == index._eps[KEY].media
    finally:
        late.close()
