"""Which engine metric answers each fleet aggregate, for vLLM, SGLang and our engine.

Names are as they appear on a /metrics page (counters with their `_total`; histograms by their base
name, the source appends `_bucket`). Each entry lists candidates, newest first: the first one a fleet
exports wins, so dashboards built on vLLM's older names keep working. Our engine exports vLLM's names
by design (engine/metrics.py), so its column is vLLM's current names without the fallbacks.

The simulator (simulator/autoscaling.build_observation) fills the same Observation fields from the
same quantities; the one difference is the arrival rate, which no engine counts at arrival: a live
source reads the rate of finished requests, equal to the arrival rate in steady state.
"""

from __future__ import annotations

ENGINES = ("vllm", "sglang", "slopilot")

# aggregate -> (how it is read, {engine: candidate names})
# sum: fleet total of a gauge; avg: mean over replicas; rate: sum of per-replica rates over the window;
# buckets: sum by (le) of the bucket rates, for histogram_quantile.
NAMES: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "num_waiting": ("sum", {
        "vllm": ("vllm:num_requests_waiting",),
        "sglang": ("sglang:num_queue_reqs",),
        "slopilot": ("vllm:num_requests_waiting",),
    }),
    "num_running": ("sum", {
        "vllm": ("vllm:num_requests_running",),
        "sglang": ("sglang:num_running_reqs",),
        "slopilot": ("vllm:num_requests_running",),
    }),
    "kv_usage": ("avg", {
        "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "sglang": ("sglang:token_usage",),
        "slopilot": ("vllm:kv_cache_usage_perc",),
    }),
    # one increment per finished request (any finish reason)
    "requests": ("rate", {
        "vllm": ("vllm:request_success_total",),
        "sglang": ("sglang:num_requests_total",),
        "slopilot": ("vllm:request_success_total",),
    }),
    # prompt / generated tokens of finished requests (SGLang counts both when a request finishes)
    "prompt_tokens": ("rate", {
        "vllm": ("vllm:request_prompt_tokens_sum",),
        "sglang": ("sglang:prompt_tokens_total",),
        "slopilot": ("vllm:request_prompt_tokens_sum",),
    }),
    "output_tokens": ("rate", {
        "vllm": ("vllm:request_generation_tokens_sum",),
        "sglang": ("sglang:generation_tokens_total",),
        "slopilot": ("vllm:request_generation_tokens_sum",),
    }),
    "ttft": ("buckets", {
        "vllm": ("vllm:time_to_first_token_seconds",),
        "sglang": ("sglang:time_to_first_token_seconds",),
        "slopilot": ("vllm:time_to_first_token_seconds",),
    }),
    # per-request mean time per output token; SGLang exported it only in older releases
    "tpot": ("buckets", {
        "vllm": ("vllm:request_time_per_output_token_seconds",),
        "sglang": ("sglang:time_per_output_token_seconds",),
        "slopilot": ("vllm:request_time_per_output_token_seconds",),
    }),
    # vLLM before the v1 engine called its inter-token histogram time_per_output_token_seconds
    "itl": ("buckets", {
        "vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "sglang": ("sglang:inter_token_latency_seconds",),
        "slopilot": ("vllm:inter_token_latency_seconds",),
    }),
}


def candidates(aggregate: str, engine: str) -> tuple[str, tuple[str, ...]]:
    """(how it is read, candidate names) of one aggregate for one engine."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: must be one of {', '.join(ENGINES)}")
    kind, table = NAMES[aggregate]
    return kind, table[engine]


def detect_engine(metric_names: set[str]) -> str | None:
    """The engine whose names a /metrics page carries (ours answers as vLLM: same names), else None."""
    if any(n.startswith("sglang:") for n in metric_names):
        return "sglang"
    if any(n.startswith("vllm:") for n in metric_names):
        return "vllm"
    return None


def format_duration(seconds: float) -> str:
    """A window in PromQL's duration syntax: whole seconds as `30s`, else milliseconds."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def promql(kind: str, name: str, selector: str, window: str) -> str:
    """The PromQL both sources run for one aggregate (`selector`: label matchers without braces)."""
    sel = f"{{{selector}}}" if selector else ""
    if kind == "sum":
        return f"sum({name}{sel})"
    if kind == "avg":
        return f"avg({name}{sel})"
    if kind == "rate":
        return f"sum(rate({name}{sel}[{window}]))"
    if kind == "buckets":
        return f"sum by (le) (rate({name}_bucket{sel}[{window}]))"
    raise ValueError(f"unknown aggregate kind {kind!r}")
