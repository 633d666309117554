"""What a policy sees at one evaluation: the caller's clock, the replica counts and the metric values.

The same Observation shape is filled by the simulator, by `slopilot replay` and by the live controller.
Trigger metrics (KEDA-style) go in `metrics`; the LLM fields are fleet-wide aggregates that the
SLO-aware and KPA policies read. Any field may be left at its default when no source provides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# groups of the fleet aggregates below, as a policy type declares what it reads (autoscaler.registry)
# and a metric source fills them (each group one or two queries)
AGGREGATES = ("arrival_rate", "mean_tokens", "num_waiting", "num_running", "kv_usage", "ttft", "tpot", "itl")


@dataclass
class Observation:
    time: float  # seconds, the caller's clock (virtual in the simulator, wall in the controller)
    current_replicas: int  # the scale target's spec.replicas (provisioned, ready or not)
    ready_replicas: int | None = None  # replicas ready to serve; None = same as current_replicas
    # trigger name (or query) -> value; None = the query returned an empty result
    metrics: dict[str, float | None] = field(default_factory=dict)
    errors: set[str] = field(default_factory=set)  # trigger names whose query failed this time
    # LLM fleet aggregates (None = unknown)
    arrival_rate: float | None = None  # requests per second entering the fleet
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    num_waiting: float | None = None  # requests queued, summed over replicas
    num_running: float | None = None  # requests in the running batch, summed over replicas
    kv_usage: float | None = None  # mean KV-cache usage over ready replicas, 0..1
    ttft_p: dict[float, float] = field(default_factory=dict)  # percentile (e.g. 90) -> seconds
    tpot_p: dict[float, float] = field(default_factory=dict)  # time per output token percentiles, s
    itl_p: dict[float, float] = field(default_factory=dict)  # inter-token latency percentiles, s
    starting_replicas: int = 0  # provisioned but not yet ready (counted as in-flight capacity)
    max_batch_seqs: int | None = None  # engine's max running sequences, when the caller knows it

    @property
    def ready(self) -> int:
        return self.current_replicas if self.ready_replicas is None else self.ready_replicas

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["errors"] = sorted(self.errors)
        return d
