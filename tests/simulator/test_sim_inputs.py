"""Scenario validation, trace readers (bad lines name file and line), workloads and synthetic tokens."""

import numpy as np
import pytest

from simulator.dists import parse_dist
from simulator.scenario import load_scenario
from simulator.tokens import prompt_token_ids
from simulator.traces import (
    compress_time,
    read_azure,
    read_burstgpt,
    read_generic_csv,
    read_mooncake,
    scale_rate,
)
from simulator.workload import RateCurve, arrival_times

BASE = {
    "duration": 60,
    "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 100, "output_tokens": 10},
    "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4", "replicas": 1}],
}


def _with(path: str, value):
    import copy

    d = copy.deepcopy(BASE)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    node[keys[-1]] = value
    return d


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("pools.0.max_num_seqs", 0, "pools[0].max_num_seqs: must be >= 1"),
        ("pools.0.max_num_seqs", 2.5, "pools[0].max_num_seqs: must be an integer"),
        ("pools.0.colour", "red", "pools[0].colour: unknown field"),
        ("router", {"policy": "fastest"}, "router.policy: must be one of"),
        ("router", {"latency_ms": -2}, "router.latency_ms: must be >= 0"),
        ("pools.0.wakeup_ms", "1ms", "pools[0].wakeup_ms: must be a number"),
        ("workload.arrivals", {"rate": 1, "cv": 2}, "workload.arrivals.cv"),
        ("workload.prompt_tokens", {"dist": "zipf"}, "workload.prompt_tokens.dist: unknown distribution"),
        ("workload.output_tokens", {"dist": "lognormal", "mean": 10, "median": 20}, "mean >= median"),
        ("slo", {"ttft": {"threshold": -1}}, "slo.ttft.threshold: must be > 0"),
        ("autoscaler", {"schedule": [{"at": 10, "replicas": 2}, {"at": 5, "replicas": 1}]}, "non-decreasing"),
        ("autoscaler", {"fixed": 2, "extra": 1}, "autoscaler.extra: unknown field"),
        ("duration", "long", "duration: must be a number"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(path, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(_with(path, value))


def test_unknown_top_level_key_and_valid_defaults():
    with pytest.raises(ValueError, match="workers: unknown field"):
        load_scenario(dict(BASE, workers=3))
    sc = load_scenario(BASE)
    assert sc.pools[0].max_num_batched_tokens == 8192 and sc.router.config.policy == "least_outstanding"


def test_kv_blocks_from_gpu_memory():
    sc = load_scenario(
        _with(
            "pools.0.kv_memory",
            {
                "gpu_memory_gib": 80,
                "num_gpus": 4,
                "weights_gib": 130,
                "kv_bytes_per_token": 327680,
                "utilization": 0.9,
            },
        )
    )
    tokens = (80 * 4 * 0.9 - 130) * 2**30 / 327680
    assert sc.pools[0].num_kv_blocks() == int(tokens // 16)


def test_bad_trace_lines_name_file_and_line(tmp_path):
    az = tmp_path / "az.csv"
    az.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.0000000,abc,5\n"
    )
    with pytest.raises(ValueError, match=r"az.csv:3: column 'ContextTokens'"):
        read_azure(az)
    mc = tmp_path / "mc.jsonl"
    mc.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n{"timestamp": 5,\n'
    )
    with pytest.raises(ValueError, match=r"mc.jsonl:2: invalid JSON"):
        read_mooncake(mc)
    mc.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": ["x"]}\n')
    with pytest.raises(ValueError, match=r"mc.jsonl:1: field 'hash_ids'"):
        read_mooncake(mc)
    g = tmp_path / "g.csv"
    g.write_text("t,p,o\n0.5,10,3\n")
    with pytest.raises(ValueError, match="missing column"):
        read_generic_csv(g)
    tr = read_generic_csv(g, "t", "p", "o")
    assert list(tr.prompt) == [10] and tr.times[0] == 0.0


def test_burstgpt_trace(tmp_path):
    # BurstGPT's columns (its failed requests have 0 response tokens); times start at 0 once read
    bg = tmp_path / "burst.csv"
    bg.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "46,GPT-4,233,141,374,API log\n"
    )
    tr = read_burstgpt(bg)
    assert list(tr.times) == [0.0, 40.0, 41.0]
    assert list(tr.prompt) == [472, 1087, 233]
    assert tr.output[0] == 18 and tr.output[2] == 141
    bg.write_text("Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,x,18\n")
    with pytest.raises(ValueError, match=r"burst.csv:2: column 'Request tokens'"):
        read_burstgpt(bg)
    bg.write_text("Timestamp,Model,Request tokens\n5,ChatGPT,10\n")
    with pytest.raises(ValueError, match=r"burst.csv:1: missing column"):
        read_burstgpt(bg)


def test_azure_and_mooncake_traces(shared_data):
    az = read_azure(shared_data / "traces" / "azure_llm_2023_conv.csv")
    assert len(az) == 19366
    assert len(az) / az.times[-1] == pytest.approx(5.5, rel=0.05)
    assert np.mean(az.prompt) == pytest.approx(1155, rel=0.01)
    mc = read_mooncake(shared_data / "traces" / "mooncake_conversation.jsonl")
    assert len(mc) == 12031 and mc.hash_ids[0][0] == 0
    fast = compress_time(az, 2.0)
    assert fast.times[-1] == pytest.approx(az.times[-1] / 2)
    rng = np.random.default_rng(0)
    half, double = scale_rate(az, 0.5, rng), scale_rate(az, 2.0, rng)
    assert len(half) == pytest.approx(len(az) / 2, rel=0.03) and len(double) == 2 * len(az)
    assert double.times[-1] <= az.times[-1] + 1e-9 and np.all(np.diff(double.times) >= 0)


def test_mooncake_hash_blocks_become_equal_token_blocks():
    a = prompt_token_ids(0, 1100, [7, 8, 9])
    b = prompt_token_ids(1, 1300, [7, 8, 42])
    assert a[:1024] == b[:1024] and a[1024:1040] != b[1024:1040]
    assert len(a) == 1100 and len(b) == 1300
    assert prompt_token_ids(3, 50)[:16] != prompt_token_ids(4, 50)[:16]


@pytest.mark.parametrize("cv", [1.0, 3.0])
def test_arrival_rate_and_cv(cv):
    rng = np.random.default_rng(1)
    t = arrival_times(RateCurve("constant", rate=20.0), 2000.0, cv, rng)
    gaps = np.diff(t)
    assert len(t) / 2000.0 == pytest.approx(20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_diurnal_and_spike_shape_the_rate():
    rng = np.random.default_rng(2)
    curve = RateCurve(
        "diurnal",
        mean=10.0,
        amplitude=0.5,
        period=1000.0,
        spikes=[{"at": 600, "duration": 100, "factor": 3.0, "ramp": 0}],
    )
    t = arrival_times(curve, 1000.0, 1.0, rng)
    trough = np.sum(t < 100) / 100.0  # rate near 5 at t ~ 0
    peak = np.sum((t >= 450) & (t < 550)) / 100.0  # rate near 15 at t = 500
    spike = np.sum((t >= 600) & (t < 700)) / 100.0  # 3x the diurnal rate there (~13.1)
    assert trough < 8 and peak > 12 and spike > 30
    pw = RateCurve("piecewise", points=[(0, 0.0), (100, 10.0)])
    assert pw(np.array([50.0]))[0] == pytest.approx(5.0)  # a linear ramp


def test_lognormal_from_mean_and_median():
    d = parse_dist({"dist": "lognormal", "mean": 211, "median": 129}, "x", integer=True)
    x = d.sample(np.random.default_rng(0), 200_000)
    assert np.median(x) == pytest.approx(129, rel=0.02) and x.mean() == pytest.approx(211, rel=0.03)
