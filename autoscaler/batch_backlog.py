"""A deferred batch backlog for the model-based policy: scale for the interactive load, let the batch
fill the capacity that leaves idle, and add capacity only when the batch would otherwise miss its
deadline (the live Batch API's metrics, controlplane.batch.metrics, read as triggers):

    batch_backlog       lines not yet answered              slopilot_batch_backlog_requests
    batch_deadline      seconds to the earliest deadline     slopilot_batch_earliest_deadline_seconds
    batch_answered      lines answered a second now          rate of slopilot_batch_lines_total
    batch_prompt_tokens, batch_output_tokens  rates of batch_request_{prompt,generation}_tokens_total

The engines' aggregates count batch lines with interactive requests; the answered lines' rate and
token rates are taken out of them first, so the interactive rate and length mix are sized alone (a
fallback: a replica that has just started has a counter series whose windowed rate undercounts, so
the difference can fall to nothing; the sloModel's promptTokensQuery/outputTokensQuery, the router's
count of one band's tokens, replace that mix and are what a spec should read), and
while a backlog is left the engines' waiting requests are taken as its lines (up to the backlog):
batch lines wait at an engine by design, and interactive requests that must wait show in the
gateway's queue (queueQuery) once the engines saturate.

serve "deadline" (the priority-aware rule): the batch needs backlog / (time left - guard) lines a
second, guard = startup delay + two polls (what a replica ordered now needs to help). While the lines
answered a second meet that (or within `grace` seconds of the backlog appearing, before a rate is
measured) the interactive sizing stands; otherwise the fleet is sized for the interactive load plus
that batch rate, both at the SLO (the batch as if it were interactive traffic of its own lengths: an
upper bound on what background work needs).
serve "arrival" (the comparison): the backlog is a queue to drain in drainSeconds, sized the same way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from autoscaler.observation import Observation

SERVE = ("deadline", "arrival")
# option -> trigger name (obs.metrics)
SIGNALS = {"backlog_query": "batch_backlog", "deadline_query": "batch_deadline",
           "answered_query": "batch_answered", "prompt_tokens_query": "batch_prompt_tokens",
           "output_tokens_query": "batch_output_tokens"}


@dataclass(frozen=True)
class BacklogOptions:
    backlog_query: str = ""
    deadline_query: str = ""
    answered_query: str = ""
    prompt_tokens_query: str = ""
    output_tokens_query: str = ""
    serve: str = "deadline"
    grace: float = 30.0

    def __post_init__(self):
        if self.serve not in SERVE:
            raise ValueError(f"spec.policy.sloModel.batchServe: must be deadline or arrival, not "
                             f"{self.serve!r}")


def value(obs: Observation, name: str) -> float:
    v = obs.metrics.get(name)
    return 0.0 if v is None or math.isnan(v) else float(v)


def interactive(obs: Observation) -> Observation:
    """obs with the answered batch lines taken out of the engines' finished-request rate and length
    mix (a mix that cannot be separated is left unknown rather than wrong)."""
    backlog = value(obs, "batch_backlog")
    if obs.num_waiting and backlog > 0:
        obs = dataclasses.replace(obs, num_waiting=max(obs.num_waiting - backlog, 0.0))
    lines = value(obs, "batch_answered")
    total = obs.arrival_rate
    if total is None or lines <= 0:
        return obs
    rate = max(total - lines, 0.0)
    mix = {}
    for field, name in (("mean_prompt_tokens", "batch_prompt_tokens"),
                        ("mean_output_tokens", "batch_output_tokens")):
        mean = getattr(obs, field)
        left = None if mean is None else mean * total - value(obs, name)
        mix[field] = left / rate if left is not None and rate > 1e-6 and left > 0 else None
    return dataclasses.replace(obs, arrival_rate=rate, **mix)


def with_mix(obs: Observation) -> Observation:
    """obs with the mean prompt/output tokens read by the mix queries (triggers mix_prompt_tokens and
    mix_output_tokens), where they gave a positive number."""
    mix = {}
    for field, name in (("mean_prompt_tokens", "mix_prompt_tokens"),
                        ("mean_output_tokens", "mix_output_tokens")):
        v = obs.metrics.get(name)
        if v is not None and not math.isnan(v) and v > 0:
            mix[field] = float(v)
    return dataclasses.replace(obs, **mix) if mix else obs


def line_shape(obs: Observation, prompt: float, output: float) -> tuple[float, float]:
    """A batch line's mean (prompt, output) tokens from the answered ones; the given ones before."""
    lines = value(obs, "batch_answered")
    if lines <= 0:
        return prompt, output
    p, o = value(obs, "batch_prompt_tokens") / lines, value(obs, "batch_output_tokens") / lines
    return (p if p > 0 else prompt), (o if o > 0 else output)


class BatchBacklog:
    def __init__(self, options: BacklogOptions, startup_delay: float, polling_interval: float,
                 drain_seconds: float):
        self.o, self.drain = options, drain_seconds
        self.guard = startup_delay + 2.0 * polling_interval
        self.since: float | None = None  # when the backlog was first seen non-empty

    def state_dict(self) -> dict:
        return {"batch_since": self.since}

    def load_state_dict(self, state: dict) -> None:
        self.since = state.get("batch_since")

    def needed_rate(self, obs: Observation) -> tuple[float, str]:
        """(lines a second to provision for beyond what idle capacity gives, why)."""
        backlog = value(obs, "batch_backlog")
        if backlog <= 0:
            self.since = None
            return 0.0, ""
        now = obs.time
        if self.since is None:
            self.since = now
        if self.o.serve == "arrival":
            return backlog / self.drain, f"batch {backlog:.0f} lines served at arrival"
        left = obs.metrics.get("batch_deadline")
        if left is None or math.isnan(left):
            return 0.0, f"batch {backlog:.0f} lines, no deadline seen"
        need = backlog / max(left - self.guard, 1.0)
        answered = value(obs, "batch_answered")
        if now - self.since < self.o.grace or answered >= need:
            return 0.0, f"batch on track ({answered:.1f} >= {need:.1f} lines/s)"
        return need, f"batch behind ({answered:.1f} < {need:.1f} lines/s, {left:.0f} s left)"

    def size(self, obs: Observation, need: int, rate: float, prompt: float, output: float,
             sizing: Callable[[float, float, float], int]) -> tuple[int, float, str]:
        """(replicas, batch lines/s provisioned, why): need (the interactive sizing) or the sizing of
        the interactive rate plus the batch's needed rate at their blended lengths."""
        batch, why = self.needed_rate(obs)
        if batch <= 0:
            return need, 0.0, why
        bp, bo = line_shape(obs, prompt, output)
        total = rate + batch
        blended_p = (rate * prompt + batch * bp) / total
        blended_o = (rate * output + batch * bo) / total
        return max(need, sizing(total, blended_p, blended_o)), batch, why
