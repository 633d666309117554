"""The pdModel policy type: one pool of a disaggregated prefill/decode service sized on its own role's
needs with a step-time model (autoscaler.pd_model). Two InferenceAutoscalers, one per pool, make the
P/D autoscaler: role prefill on the prefill pool, role decode on the decode pool."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoscaler.forecast import DemandOptions
from autoscaler.keda import Trigger
from autoscaler.pd_model import PdModelPolicy
from autoscaler.registry import PolicyType, option, param_default, register

POS, NONNEG = {"type": "number", "exclusiveMinimum": 0}, {"type": "number", "minimum": 0}
_DEMAND = {f.name: f.default for f in dataclasses.fields(DemandOptions)}


def _o(spec_name: str, keyword: str, schema: dict, meaning: str = ""):
    """An option whose default is written once: in DemandOptions or in PdModelPolicy's signature."""
    default = _DEMAND[keyword] if keyword in _DEMAND else param_default(PdModelPolicy, keyword)
    return option(spec_name, default, schema, meaning)


@dataclass(frozen=True)
class PdModelOptions:  # field names are PdModelPolicy's keywords and DemandOptions' fields
    role: str = option("role", "decode", {"enum": ["prefill", "decode"]},
                       "which pool of the P/D service this autoscaler sizes: prefill (on prompt tokens and "
                       "TTFT) or decode (on running sequences, KV and TPOT)")
    margin: float = _o("margin", "margin", {"type": "number", "minimum": 0, "maximum": 0.9})
    forecast_window: float = _o("forecastWindowSeconds", "forecast_window", POS)
    scale_down_delay: float = _o("scaleDownDelaySeconds", "scale_down_delay", NONNEG)
    max_batch_seqs: int = _o("maxBatchSeqs", "max_batch_seqs", {"type": "integer", "minimum": 1})
    prompt_cv: float = _o("promptCV", "prompt_cv", NONNEG)
    drain_seconds: float = _o("drainSeconds", "drain_seconds", POS)
    burst_slope: str = _o("burstSlope", "burst_slope", {"enum": ["trend", "last", "onset"]})
    drop_on_fall: bool = _o("dropOnFall", "drop_on_fall", {"type": "boolean"})
    burst_rise: float = _o("burstRise", "burst_rise", NONNEG)
    burst_z: float = _o("burstZ", "burst_z", NONNEG)
    burst_noise_floor: bool = _o("burstNoiseFloor", "burst_noise_floor", {"type": "boolean"},
                                 "the burst test's spread is at least sqrt(rate / fastWindowSeconds), a "
                                 "counted rate's Poisson noise")
    burst_baseline: str = _o("burstBaseline", "burst_baseline", {"enum": ["window", "beforeTrend"]},
                             "the trend and spread the burst test compares the rate now with: window (every "
                             "sample of the forecast window) or beforeTrend (only those older than "
                             "trendWindowSeconds, so a ramp's first samples do not hide it from its test)")
    decode_ttft: float = _o("decodeTtftSeconds", "decode_ttft", {**NONNEG, "maximum": 3600},
                            "prefill role: the TTFT the prefill pool cannot shorten (transfer, decode "
                            "admission, first decode step), taken from the TTFT SLO")
    kv_tokens: float = _o("kvTokensPerReplica", "kv_tokens", {**NONNEG, "maximum": 1e12},
                          "decode role: KV tokens one replica holds (0: the observed KV usage only)")
    kv_target: float = _o("kvTarget", "kv_target", {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                          "decode role: the KV usage a replica is sized to stay under")
    prefill_threshold: float = _o("prefillThreshold", "prefill_threshold", {**NONNEG, "maximum": 1e7},
                                  "decode role: the router's P/D threshold; shorter prompts are prefilled "
                                  "on the decode pool and slow its steps (0: none)")
    scale_down_headroom: float = _o("scaleDownHeadroom", "scale_down_headroom", {**NONNEG, "maximum": 10},
                                    "hysteresis: the pool shrinks only to a count that would still meet its "
                                    "target at (1 + this) x the rate (0: at the rate)")
    burst_confirm: float = _o("burstConfirmSeconds", "burst_confirm", {**NONNEG, "maximum": 3600},
                              "a burst test's firing that stops sooner than this (a noisy poll) has its "
                              "recommendations withdrawn, cancelling the replicas still starting (0: never)")
    rate_headroom: float = _o("rateHeadroom", "rate_headroom", {**NONNEG, "maximum": 10},
                              "standing headroom: the pool is sized for (1 + this) x the rate at every "
                              "count, not only on the way down as scaleDownHeadroom (0: at the rate)")
    arrivals_query: str = _o("arrivalsQuery", "arrivals_query", {"type": "string"},
                             "PromQL for the router's arrival counter, read as the rate now (fast signal; "
                             "the prefill role takes its pool's share of it)")
    fast_window: float = _o("fastWindowSeconds", "fast_window", POS,
                            "the arrival counter's rise over this window is the rate now")
    trend_window: float = _o("trendWindowSeconds", "trend_window", POS)


def build(spec, options: PdModelOptions, latency_model) -> PdModelPolicy:
    given = dataclasses.asdict(options)
    demand = DemandOptions(**{k: given.pop(k) for k in _DEMAND if k in given})
    return PdModelPolicy(given.pop("role"), spec.slos, latency_model, min_replicas=spec.min_replicas,
                         max_replicas=spec.max_replicas, polling_interval=spec.polling_interval,
                         startup_delay=spec.startup_delay, demand=demand, **given)


def triggers(o: PdModelOptions) -> list[Trigger]:
    """The router's arrival counter as the trigger "arrivals" (read as any trigger) when given."""
    return [Trigger("arrivals", o.arrivals_query, 0.0)] if o.arrivals_query else []


PD_MODEL = register(PolicyType(
    "pdModel", build, reads=("arrival_rate", "mean_tokens", "num_waiting", "num_running", "kv_usage"),
    options=PdModelOptions, needs_latency_model=True, needs_slo=True, triggers=triggers,
    no_keda="the P/D model-based policy predicts each role's latency from a step-time model; KEDA triggers "
    "cannot express it",
    meaning="one pool of a prefill/decode service, sized on its role's needs with a latency model",
))
