"""Scenario values that would need unbounded memory or time are refused when the file loads, naming the
field, the value and the limit (never a MemoryError or a run that does not end)."""

import copy
import time
from pathlib import Path

import pytest

from simulator import scenario_limits as lim
from simulator.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = {
    "duration": 600,
    "workload": {"arrivals": {"rate": 2}, "prompt_tokens": 100, "output_tokens": 10},
    "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4", "replicas": 1}],
}
SPEC = {
    "apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": "a"},
    "spec": {"scaleTargetRef": {"name": "x"}, "minReplicas": 1, "maxReplicas": 8,
             "policy": {"type": "kpa"}},
}


def _with(path: str, value, base=BASE) -> dict:
    d = copy.deepcopy(base)
    node, keys = d, path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node.setdefault(k, {})
    node[keys[-1]] = value
    return d


def _refused(data: dict, *parts: str) -> str:
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        load_scenario(data)
    assert time.perf_counter() - start < 2  # refused up front, not after building anything big
    for part in parts:
        assert part in str(err.value), str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "path,value,field,limit",
    [
        ("duration", 1e9, "duration", f"must be <= {lim.MAX_DURATION}"),
        ("pools.0.replicas", 10**9, "pools[0].replicas", f"must be <= {lim.MAX_REPLICAS}"),
        ("pools.0.max_num_seqs", 10**7, "pools[0].max_num_seqs", f"must be <= {lim.MAX_NUM_SEQS}"),
        ("pools.0.max_model_len", 10**12, "pools[0].max_model_len", f"must be <= {lim.MAX_TOKENS}"),
        ("pools.0.max_num_batched_tokens", 10**9, "max_num_batched_tokens", f"<= {lim.MAX_TOKENS}"),
        ("pools.0.kv_blocks", 10**10, "pools[0].kv_blocks", f"must be <= {lim.MAX_KV_BLOCKS}"),
        ("pools.0.block_size", 10**6, "pools[0].block_size", f"must be <= {lim.MAX_BLOCK_SIZE}"),
        ("pools.0.failure", {"mtbf": 0.001}, "pools[0].failure.mtbf", f"must be >= {lim.MIN_MTBF}"),
        ("workload.arrivals", {"rate": 1e7}, "workload.arrivals.rate", f"must be <= {lim.MAX_RATE}"),
        ("workload.arrivals", {"diurnal": {"mean": 1e9}}, "diurnal.mean", f"<= {lim.MAX_RATE}"),
        ("workload.arrivals", {"piecewise": [[0, 1], [60, 1e8]]}, "piecewise[1][1]", f"<= {lim.MAX_RATE}"),
        ("workload.arrivals", {"piecewise": [[0, 1], [1e12, 1]]}, "piecewise[1][0]", "<= 2592000"),
        ("workload.arrivals", {"rate": 1, "spikes": [{"at": 0, "duration": 10, "factor": 1e9}]},
         "spikes[0].factor", f"must be <= {lim.MAX_SPIKE_FACTOR}"),
        ("workload.arrivals", {"rate": 1, "process": "gamma", "cv": 1e6}, "arrivals.cv",
         f"must be <= {lim.MAX_CV}"),
        ("workload.max_prompt_tokens", 10**12, "workload.max_prompt_tokens", f"<= {lim.MAX_TOKENS}"),
        ("metrics", {"scrape_interval": 1e-6}, "metrics.scrape_interval", f">= {lim.MIN_SCRAPE_INTERVAL}"),
        ("metrics", {"rate_window": 1e9}, "metrics.rate_window", f"must be <= {lim.MAX_WINDOW}"),
        ("output", {"timeline_interval": 1e-9}, "output.timeline_interval", f">= {lim.MIN_INTERVAL}"),
        ("drain", {"max": 1e12}, "drain.max", f"must be <= {lim.MAX_DURATION}"),
        ("router", {"prefix_lru_blocks": 10**12}, "router.prefix_lru_blocks", f"<= {lim.MAX_LRU_BLOCKS}"),
        ("pools.0.autoscaler", {"fixed": 10**8}, "pools[0].autoscaler.fixed", f"<= {lim.MAX_REPLICAS}"),
        ("pools.0.autoscaler", {"schedule": [{"at": 0, "replicas": 1}], "polling_interval": 1e-7},
         "autoscaler.polling_interval", f">= {lim.MIN_INTERVAL}"),
        ("router", {"flow_control": {"interval": 1e-9}}, "router.flow_control.interval",
         f">= {lim.MIN_INTERVAL}"),
        ("router", {"flow_control": {"bands": [{"priority": 0, "capacity": 10**12}]}},
         "router.flow_control.bands[0].capacity", f"<= {lim.MAX_REQUESTS}"),
    ],
)
def test_single_fields_beyond_their_limit(path, value, field, limit):
    message = _refused(_with(path, value), field, limit)
    assert "got" in message  # the value given


@pytest.mark.parametrize(
    "changes,parts",
    [
        ({"workload.arrivals": {"rate": 50_000}, "duration": 2_000_000},
         ["workload.arrivals: about 100,000,000,000 requests", f"limit of {lim.MAX_REQUESTS:,}"]),
        ({"workload.arrivals": {"diurnal": {"mean": 10_000, "amplitude": 0.5}}, "duration": 86_400},
         ["workload.arrivals: about", "requests over the duration of 86400 s"]),
        ({"workload.arrivals": {"piecewise": [[0, 0], [1000, 100_000]]}, "duration": 1000},
         ["workload.arrivals: about 50,000,000 requests"]),
        ({"workload.arrivals": {"rate": 1, "spikes": [{"at": 0, "duration": 50_000, "factor": 1000}]},
          "duration": 100_000}, ["workload.arrivals: about 50,050,000 requests"]),
        ({"workload.prompt_tokens": {"dist": "lognormal", "mu": 40, "sigma": 1}},
         ["workload.prompt_tokens: a mean (or largest value) of", f"limit of {lim.MAX_TOKENS:g} tokens"]),
        ({"workload.output_tokens": {"dist": "lognormal", "mean": 1e6, "median": 1}},
         ["workload.output_tokens: sigma 5.26 is more than the limit of 4"]),
        ({"workload.output_tokens": {"dist": "lognormal", "mu": 1, "sigma": 30}},
         ["workload.output_tokens: sigma 30 is more than the limit of 4"]),
        ({"workload.prompt_tokens": 10**9}, ["workload.prompt_tokens: a mean (or largest value) of 1e+09"]),
        ({"workload.prompt_tokens": {"dist": "uniform", "low": 1, "high": 1e15}}, ["1e+15 is more than"]),
        ({"workload.prompt_tokens": {"dist": "empirical", "values": [10, 1e13]}}, ["1e+13 is more than"]),
        ({"workload.output_tokens": {"dist": "exponential", "mean": 100, "max": 1e14}},
         ["workload.output_tokens: max 1e+14 is more than"]),
        ({"workload.output_tokens": {"dist": "normal", "mean": 100, "std": 1e12}}, ["std 1e+12"]),
        ({"workload.output_tokens": {"dist": "gamma", "mean": 100, "cv": 1e6}}, ["cv 1e+06"]),
        ({"metrics": {"scrape_interval": 0.1, "rate_window": 3600}},
         ["metrics.scrape_interval: 0.1 s keeps 144,000 samples", f"limit of {lim.MAX_SAMPLES:,}"]),
        ({"duration": 2_000_000, "metrics": {"scrape_interval": 0.1}, "workload.arrivals": {"rate": 0.1}},
         ["metrics.scrape_interval: an interval of 0.1 s over the", "scrapes, more than the limit"]),
        ({"duration": 2_000_000, "output": {"timeline_interval": 0.01}, "workload.arrivals": {"rate": 0.1}},
         ["output.timeline_interval: an interval of 0.01 s", "timeline rows"]),
        ({"duration": 2_000_000, "workload.arrivals": {"rate": 0.1},
          "pools.0.autoscaler": {"schedule": [{"at": 0, "replicas": 1}], "polling_interval": 0.01}},
         ["pools[0].autoscaler: an interval of 0.01 s", "autoscaler polls"]),
        ({"duration": 2_000_000, "workload.arrivals": {"rate": 0.1}, "router": {"flow_control": {}}},
         ["router.flow_control.interval: an interval of 0.01 s", "gateway dispatch rounds"]),
        ({"pools.0.kv_memory": {"gpu_memory_gib": 80, "num_gpus": 8, "weights_gib": 1,
                                "kv_bytes_per_token": 1}},
         ["pools[0].kv_memory: gives", f"KV blocks a replica, more than the limit of {lim.MAX_KV_BLOCKS}"]),
    ],
)
def test_combinations_beyond_their_limit(changes, parts):
    d = BASE
    for path, value in changes.items():
        d = _with(path, value, d)
    _refused(d, *parts)


@pytest.mark.parametrize(
    "spec_changes,part",
    [
        ({"maxReplicas": 10**7}, f"the spec's maximum of 10000000 replicas is more than the limit of "
                                 f"{lim.MAX_REPLICAS}"),
        ({"pollingInterval": 1e-6}, "the spec's polling interval of 1e-06 s is less than the limit"),
    ],
)
def test_policy_specs_beyond_the_limits(spec_changes, part):
    spec = copy.deepcopy(SPEC)
    spec["spec"].update(spec_changes)
    message = _refused(_with("pools.0.autoscaler", {"spec": spec}), part)
    assert message.startswith("pools[0].autoscaler:")


def test_the_limits_are_far_from_real_scenarios():
    # every shipped example loads, and a big but real scenario (a week at 10 req/s, 1,000 replicas,
    # 1-second scrapes, a 10-second timeline, 128k-token contexts) is accepted
    names = ("keda_queue", "diurnal_schedule", "slo_model_autoscale", "azure_conv_h100", "mooncake_prefix")
    for name in names:
        load_scenario(EXAMPLES / f"{name}.yaml")
    big = _with("duration", 7 * 86400)
    big = _with("workload.arrivals", {"diurnal": {"mean": 10, "amplitude": 0.8}}, big)
    big = _with("workload.prompt_tokens", {"dist": "lognormal", "mean": 4000, "median": 1500, "max": 131072},
                big)
    big = _with("pools.0.max_model_len", 131072, big)
    big = _with("pools.0.replicas", 1000, big)
    big = _with("metrics", {"scrape_interval": 1, "rate_window": 60}, big)
    big = _with("output", {"timeline_interval": 10}, big)
    sc = load_scenario(big)
    assert lim.expected_requests({"curve": {"kind": "diurnal", "mean": 10, "amplitude": 0.8,
                                            "period": 86400, "phase": 0}, "spikes": []}, 7 * 86400) < 7e6
    assert sc.pools[0].replicas == 1000


@pytest.mark.parametrize(
    "arrivals,duration,want",
    [
        ({"kind": "constant", "rate": 3.0}, 100, 300),
        ({"kind": "piecewise", "points": [(0, 0), (100, 10)]}, 100, 500),
        ({"kind": "piecewise", "points": [(0, 0), (100, 10)]}, 200, 1500),  # flat after the last point
        ({"kind": "piecewise", "points": [(50, 4), (60, 4)]}, 100, 400),  # flat before the first
    ],
)
def test_expected_requests(arrivals, duration, want):
    assert lim.expected_requests({"curve": arrivals, "spikes": []}, duration) == pytest.approx(want)
