"""The sloModel policy type: model-based SLO headroom (autoscaler.slo_model), planned with a step-time
model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoscaler.batch_backlog import SERVE, BacklogOptions
from autoscaler.batch_backlog import SIGNALS as BACKLOG_SIGNALS
from autoscaler.forecast import DemandOptions
from autoscaler.keda import Trigger
from autoscaler.registry import PolicyType, option, param_default, register
from autoscaler.slo_model import SloModelPolicy

POS, NONNEG = {"type": "number", "exclusiveMinimum": 0}, {"type": "number", "minimum": 0}
STR, BOOL = {"type": "string"}, {"type": "boolean"}


_DEMAND = {f.name: f.default for f in dataclasses.fields(DemandOptions)}
_BACKLOG = {f.name: f.default for f in dataclasses.fields(BacklogOptions)}  # fields named batch_<name> here


def _o(spec_name: str, keyword: str, schema: dict, meaning: str = ""):
    """An option whose default is written once: in DemandOptions (the forecast's) or in SloModelPolicy's
    signature (the queueing model's)."""
    if keyword in _DEMAND:
        default = _DEMAND[keyword]
    elif keyword.startswith("batch_") and keyword[6:] in _BACKLOG:
        default = _BACKLOG[keyword[6:]]
    else:
        default = param_default(SloModelPolicy, keyword)
    return option(spec_name, default, schema, meaning)


@dataclass(frozen=True)
class SloModelOptions:  # field names are SloModelPolicy's keywords and DemandOptions' fields
    margin: float = _o("margin", "margin", {"type": "number", "minimum": 0, "maximum": 0.9})
    forecast_window: float = _o("forecastWindowSeconds", "forecast_window", POS)
    scale_down_delay: float = _o("scaleDownDelaySeconds", "scale_down_delay", NONNEG)
    max_batch_seqs: int = _o("maxBatchSeqs", "max_batch_seqs", {"type": "integer", "minimum": 1})
    prompt_cv: float = _o("promptCV", "prompt_cv", NONNEG)
    drain_seconds: float = _o("drainSeconds", "drain_seconds", POS)
    # the short burst trend: its window, the rise it must predict, the noise gate
    trend_window: float = _o("trendWindowSeconds", "trend_window", POS)
    burst_rise: float = _o("burstRise", "burst_rise", NONNEG)
    burst_z: float = _o("burstZ", "burst_z", NONNEG)
    burst_slope: str = _o("burstSlope", "burst_slope", {"enum": ["trend", "last", "onset"]},
                          "the burst forecast's slope: the short trend's, the last interval's (last), or a "
                          "line through the samples since the burst's onset (onset)")
    drop_on_fall: bool = _o("dropOnFall", "drop_on_fall", BOOL)
    # fast router signals: PromQL for the arrival counter and the gateway queue
    arrivals_query: str = _o("arrivalsQuery", "arrivals_query", STR,
                             "PromQL for the router's arrival counter: the rate now and the burst test read "
                             "its rise (fast signals; without it the 60-s rate)")
    queue_query: str = _o("queueQuery", "queue_query", STR,
                          "PromQL for the router's gateway queue, added to the backlog")
    fast_window: float = _o("fastWindowSeconds", "fast_window", POS,
                            "the arrival counter's rise over this window is the rate now")
    # a learned time-of-day profile (period 0: none)
    season_period: float = _o("seasonPeriodSeconds", "season_period", NONNEG,
                              "learn a time-of-day profile of this period (0: none)")
    season_bins: int = _o("seasonBins", "season_bins", {"type": "integer", "minimum": 1, "maximum": 10000})
    season_weekly: bool = _o("seasonWeekly", "season_weekly", BOOL)
    season_weight: float = _o("seasonWeight", "season_weight", {"type": "number", "minimum": 0, "maximum": 1})
    # a deferrable batch band: its arrival counter, gateway queue and deadline
    batch_arrivals_query: str = _o("batchArrivalsQuery", "batch_arrivals_query", STR,
                                   "PromQL for the batch band's arrival counter: batch is provisioned at its "
                                   "mean rate, not its bursts")
    batch_queue_query: str = _o("batchQueueQuery", "batch_queue_query", STR,
                                "PromQL for the batch band's gateway queue")
    batch_deadline: float = _o("batchDeadlineSeconds", "batch_deadline", POS,
                               "the batch band's queue is provisioned to drain in half of this")
    # the length mix from the router (one band's), in place of the engines' (which count every band)
    prompt_tokens_query: str = _o("promptTokensQuery", "prompt_tokens_query", STR,
                                  "PromQL for a request's mean prompt tokens, read in place of the engines' "
                                  "mix (e.g. a band's slopilot_router_request_tokens_total over its "
                                  "arrivals)")
    output_tokens_query: str = _o("outputTokensQuery", "output_tokens_query", STR,
                                  "PromQL for a request's mean output tokens, read in place of the engines' "
                                  "mix")
    # a live Batch API's backlog (autoscaler.batch_backlog): deferred to its deadline, or served at arrival
    batch_backlog_query: str = _o("batchBacklogQuery", "batch_backlog_query", STR,
                                  "PromQL for the batch lines not yet answered (the router's "
                                  "slopilot_batch_backlog_requests); turns on the deadline rule")
    batch_deadline_query: str = _o("batchDeadlineQuery", "batch_deadline_query", STR,
                                   "PromQL for the seconds to the earliest batch deadline")
    batch_answered_query: str = _o("batchAnsweredQuery", "batch_answered_query", STR,
                                   "PromQL for batch lines answered a second (taken out of the engines' "
                                   "rate; the rate the deadline rule compares with the one it needs)")
    batch_prompt_tokens_query: str = _o("batchPromptTokensQuery", "batch_prompt_tokens_query", STR,
                                        "PromQL for the answered batch lines' prompt tokens a second")
    batch_output_tokens_query: str = _o("batchOutputTokensQuery", "batch_output_tokens_query", STR,
                                        "PromQL for the answered batch lines' output tokens a second")
    batch_serve: str = _o("batchServe", "batch_serve", {"enum": list(SERVE)},
                          "deadline: capacity for the batch only when its answer rate would miss the "
                          "deadline; arrival: the backlog drained in drainSeconds like a queue")
    batch_grace: float = _o("batchGraceSeconds", "batch_grace", NONNEG,
                            "seconds after a backlog appears before its answer rate is judged")
    # the burst test's spread at least a fast-window rate's counting noise
    burst_noise_floor: bool = _o("burstNoiseFloor", "burst_noise_floor", BOOL,
                                 "the burst test's spread is at least sqrt(rate / fastWindowSeconds), a "
                                 "counted rate's Poisson noise")
    burst_baseline: str = _o("burstBaseline", "burst_baseline", {"enum": ["window", "beforeTrend"]},
                             "the trend and spread the burst test compares the rate now with: window (every "
                             "sample of the forecast window) or beforeTrend (only those older than "
                             "trendWindowSeconds, so a ramp's first samples do not hide it from its test)")


# option -> the trigger name its query is read under (obs.metrics)
SIGNALS = {"arrivals_query": "arrivals", "queue_query": "queue", "batch_arrivals_query": "batch_arrivals",
           "batch_queue_query": "batch_queue"}


SIGNALS.update({"prompt_tokens_query": "mix_prompt_tokens", "output_tokens_query": "mix_output_tokens"})
SIGNALS.update({f"batch_{attr}": name for attr, name in BACKLOG_SIGNALS.items()})


def signal_triggers(o: SloModelOptions) -> list[Trigger]:
    """The fast-signal queries the options set, as triggers (read as any trigger, live or simulated)."""
    return [Trigger(name, getattr(o, attr), 0.0) for attr, name in SIGNALS.items() if getattr(o, attr)]


def build(spec, options: SloModelOptions, latency_model) -> SloModelPolicy:
    given = dataclasses.asdict(options)
    demand = DemandOptions(**{k: given.pop(k) for k in _DEMAND})
    backlog = BacklogOptions(**{k: given.pop(f"batch_{k}") for k in _BACKLOG})
    return SloModelPolicy(spec.slos, latency_model, min_replicas=spec.min_replicas,
                          max_replicas=spec.max_replicas, polling_interval=spec.polling_interval,
                          startup_delay=spec.startup_delay, demand=demand, backlog=backlog, **given)


SLO_MODEL = register(PolicyType(
    "sloModel", build, reads=("arrival_rate", "mean_tokens", "num_waiting"), options=SloModelOptions,
    needs_latency_model=True, needs_slo=True, triggers=signal_triggers,
    no_keda="the model-based SLO-headroom policy predicts latency from a step-time model and forecasts "
    "the arrival rate; KEDA triggers cannot express it",
    meaning="model-based SLO headroom: predicts latency from the load with a latency model",
))
