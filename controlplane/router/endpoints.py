"""The router's view of each endpoint: scraped gauges plus its own in-flight count, health and ejection.

Gauges come from the endpoint's /metrics page (vLLM, SGLang or our engine; names from
controlplane.sources.names). Only the few gauge lines are read: the full text parser costs tens of
milliseconds a page, too much ten times a second. Between scrapes the router's own counts carry the
estimate (Endpoint.num_waiting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import urlencode

from controlplane.sources.names import NAMES

GAUGES = {agg: tuple(n for names in NAMES[agg][1].values() for n in names)
          for agg in ("num_waiting", "num_running", "kv_usage")}
_WANTED = {name: agg for agg, names in GAUGES.items() for name in names}
# asks for those gauges only: prometheus_client's exposition (vLLM's, SGLang's /metrics) honours
# name[] and renders a few lines instead of every histogram; a server that ignores it sends it all
METRICS_QUERY = urlencode([("name[]", n) for n in sorted(_WANTED)])


MAX_GAUGE = 1e9  # no engine queues or runs more requests; a larger sample is a broken page


def read_gauges(text: str, bad: list[str] | None = None) -> tuple[dict[str, float], set[str]]:
    """{num_waiting, num_running, kv_usage} from a text-format /metrics page (summed over the page's
    series; KV usage averaged), and the model names its gauge series carry. A sample that is NaN,
    infinite (+Inf, 1e999), negative or over MAX_GAUGE is skipped, and its line added to `bad`."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    models: set[str] = set()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        name = line[:brace] if 0 < brace < space or (brace > 0 and space < 0) else line[:space]
        agg = _WANTED.get(name)
        if agg is None:
            continue
        close = line.rfind("}")
        parts = line[close + 1:].split() if close > 0 else line[space:].split()
        try:
            value = float(parts[0])
        except (IndexError, ValueError):
            continue
        if not 0.0 <= value <= MAX_GAUGE:  # NaN fails both comparisons
            if bad is not None:
                bad.append(line[:200])
            continue
        sums[agg] = sums.get(agg, 0.0) + value
        counts[agg] = counts.get(agg, 0) + 1
        at = line.find('model_name="', brace) if close > 0 else -1
        if at > 0:
            models.add(line[at + 12:line.index('"', at + 12)])
    if "kv_usage" in sums:
        sums["kv_usage"] /= counts["kv_usage"]
    return sums, models


@dataclass
class Endpoint:
    """One engine behind the router (a ReplicaView for the shared scorers)."""

    url: str
    id: int
    healthy: bool = True  # False while ejected
    draining: bool = False  # removed by discovery: finishes what it has, gets nothing new
    num_running: int = 0
    kv_usage: float = 0.0
    outstanding: int = 0  # requests this router sent it that have not finished
    in_flight_tokens: int = 0
    scraped_waiting: int = 0
    outstanding_at_scrape: int = 0
    scraped_at: float = -math.inf
    failures: int = 0  # consecutive failed requests or scrapes
    models: set[str] = field(default_factory=set)
    served: int = 0
    bad_samples: int = 0  # gauge samples skipped as out of range (logged once per endpoint)
    busy_until: float = -math.inf  # monotonic time: it answered 429, so nothing new goes there before

    def serves(self, model: str) -> bool:
        """Whether it may take a request for `model` (any, while its page has shown no model name)."""
        return not model or not self.models or model in self.models

    @property
    def num_waiting(self) -> int:
        """The engine's waiting queue, the larger of two estimates: the last scrape's, moved by what
        this router sent or saw finish since; and what this router has in flight there beyond the
        running batch (exact own counts against the slowly changing batch size: it also counts
        requests still on their way in, which the page cannot show yet)."""
        return max(0, self.scraped_waiting + self.outstanding - self.outstanding_at_scrape,
                   self.outstanding - self.num_running)

    def scraped(self, gauges: dict[str, float], models: set[str], outstanding_then: int, now: float) -> None:
        self.scraped_waiting = int(gauges.get("num_waiting", 0))
        self.num_running = int(gauges.get("num_running", 0))
        self.kv_usage = min(1.0, float(gauges.get("kv_usage", 0.0)))
        self.outstanding_at_scrape = outstanding_then
        self.scraped_at = now
        self.models = models or self.models
