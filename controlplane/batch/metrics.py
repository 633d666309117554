"""The Batch API's metrics on the router's /metrics (what a priority-aware policy reads):

    slopilot_batch_backlog_requests               lines not yet answered, over running batches
    slopilot_batch_backlog_tokens{kind}           their prompt tokens (kind="prompt", the router's
                                                  estimate) and requested output tokens ("max_output":
                                                  max_tokens where the line gives one)
    slopilot_batch_earliest_deadline_seconds      time left to the earliest deadline with lines left
    slopilot_batch_deadline_slack_seconds         the least, over batches, of time left less the time
                                                  the backlog up to theirs (earliest deadline first)
                                                  takes at the last minute's answer rate
    slopilot_batch_at_risk_batches                batches whose slack is negative: their window will not
                                                  be met at that rate
    slopilot_batch_lines_total{outcome}           completed, failed, expired, cancelled
    batch_request_prompt_tokens_total{model}      llm-d batch gateway's names: usage of answered lines
    batch_request_generation_tokens_total{model}

The gate's own llm_d_epp_flow_control_queue_size{priority="batch"} shows the lines held in the gateway
at the moment (at most the runner's in-flight bound); the backlog gauges show the whole remainder.
The backlog is read from the store at each scrape (one grouped query).
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from controlplane.batch.store import CANCELLED, COMPLETED, EXPIRED, FAILED, Store

OUTCOMES = {COMPLETED: "completed", FAILED: "failed", EXPIRED: "expired", CANCELLED: "cancelled"}
RATE_WINDOW = 60.0


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry, store: Store, clock=time.time):
        self.store, self.clock = store, clock
        self.lines = Counter("slopilot_batch_lines", "Batch lines answered, by outcome", ["outcome"],
                             registry=registry)
        self.prompt_tokens = Counter("batch_request_prompt_tokens", "Prompt tokens of answered batch lines",
                                     ["model"], registry=registry)
        self.output_tokens = Counter("batch_request_generation_tokens",
                                     "Generated tokens of answered batch lines", ["model"], registry=registry)
        self._recent: deque[tuple[float, int]] = deque()  # (time, lines answered then)
        registry.register(self)

    def outcome(self, state: int, n: int) -> None:
        if n:
            self.lines.labels(OUTCOMES[state]).inc(n)
            self._recent.append((self.clock(), n))

    def answered(self, written: list[tuple]) -> None:
        """Lines just written: (batch_id, line, state, output line, (model, prompt, completion))."""
        for _, _, state, _, (model, prompt, completion) in written:
            self.lines.labels(OUTCOMES[state]).inc()
            if prompt or completion:
                self.prompt_tokens.labels(model).inc(prompt)
                self.output_tokens.labels(model).inc(completion)
        if written:
            self._recent.append((self.clock(), len(written)))

    def rate(self, now: float) -> float:
        """Lines answered a second over the last minute (0 before any)."""
        while self._recent and self._recent[0][0] < now - RATE_WINDOW:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(1.0, min(RATE_WINDOW, now - self._recent[0][0]))
        return sum(n for _, n in self._recent) / span

    def describe(self):
        return []  # collected only at scrape time (registered without a first collect)

    def collect(self):
        now = self.clock()
        backlog = self.store.backlog()
        lines = GaugeMetricFamily("slopilot_batch_backlog_requests", "Batch lines not yet answered")
        lines.add_metric([], sum(b[2] for b in backlog))
        tokens = GaugeMetricFamily("slopilot_batch_backlog_tokens", "Tokens of the batch lines not yet "
                                   "answered (prompt: estimated; max_output: requested)", labels=["kind"])
        tokens.add_metric(["prompt"], sum(b[3] or 0 for b in backlog))
        tokens.add_metric(["max_output"], sum(b[4] or 0 for b in backlog))
        yield from (lines, tokens)
        if not backlog:
            return
        left = GaugeMetricFamily("slopilot_batch_earliest_deadline_seconds",
                                 "Seconds to the earliest deadline of a batch with lines left")
        left.add_metric([], min(b[1] for b in backlog) - now)
        yield left
        slacks = self.slacks(now, backlog)
        if slacks:
            slack = GaugeMetricFamily("slopilot_batch_deadline_slack_seconds", "Least time to spare over "
                                      "running batches at the last minute's answer rate")
            slack.add_metric([], min(slacks.values()))
            risk = GaugeMetricFamily("slopilot_batch_at_risk_batches", "Batches that will miss their window "
                                     "at the last minute's answer rate")
            risk.add_metric([], sum(1 for v in slacks.values() if v < 0))
            yield from (slack, risk)

    def slacks(self, now: float, backlog: list[tuple] | None = None) -> dict[str, float]:
        """Each running batch's time to spare: time to its deadline less the time the lines up to its
        own (earliest deadline first) take at the last minute's answer rate; {} before any answer."""
        rate = self.rate(now)
        if rate <= 0:
            return {}
        out, ahead = {}, 0
        for b in sorted(self.store.backlog() if backlog is None else backlog, key=lambda b: b[1]):
            ahead += b[2]
            out[b[0]] = b[1] - now - ahead / rate
        return out
