"""Shared by the KV-transfer tests: a producer/consumer pair of engines driven without HTTP."""

from __future__ import annotations

import time

from engine.args import EngineArgs
from engine.core.sampling_params import SamplingParams
from engine.kv_transfer import parse_kv_transfer_config
from engine.kv_transfer.connector import KVConnector
from engine.llm_engine import LLMEngine


def engine(model: str, block_size: int, num_kv_blocks: int = 512) -> LLMEngine:
    return LLMEngine(EngineArgs(model=model, block_size=block_size, num_kv_blocks=num_kv_blocks,
                                max_num_batched_tokens=512))


def connector(eng: LLMEngine, role: str, lease_timeout_s: float = 60.0) -> KVConnector:
    cfg = parse_kv_transfer_config({"kv_connector": "TcpConnector", "kv_role": role,
                                    "kv_connector_extra_config": {"lease_timeout_s": lease_timeout_s}})
    return KVConnector(cfg, eng, wake=lambda: None)


def run(eng: LLMEngine, ids: list[int], params: SamplingParams, rid: str):
    seq = eng.add_request(ids, params, rid)
    while not seq.is_finished:
        eng.step()
    eng.pop_output(rid)
    return seq


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def prefill(p: LLMEngine, pc: KVConnector, ids: list[int], rid: str) -> dict:
    """The producer's half: a 1-token prefill leased for a remote decode; its kv_transfer_params."""
    assert not pc.on_add(rid, ids, {"do_remote_decode": True}, ())
    seq = run(p, ids, greedy(1), rid)
    params = pc.on_finished(seq)
    assert params is not None and params["do_remote_prefill"]
    return params


def decode(d: LLMEngine, dc: KVConnector, ids: list[int], params: dict, rid: str, max_tokens: int,
           timeout: float = 30.0):
    """The consumer's half: pull the blocks, then decode; the sequence, and the pull's error if any."""
    args = (ids, greedy(max_tokens), rid, None, 0)
    assert dc.on_add(rid, ids, params, args)
    deadline = time.monotonic() + timeout
    while True:
        _, pulls = dc.tick()
        if pulls:
            break
        assert time.monotonic() < deadline, "the pull never came back"
        time.sleep(0.002)
    (pull, error), = pulls
    if error is not None:
        return None, error
    return run(d, ids, greedy(max_tokens), rid), None
