"""The metric-source interface (one adapter per kind, as KEDA's scalers) and the Observation they fill.

    obs = source.observe(spec, now, current=3, ready=2)

Per trigger: `obs.metrics[name]` holds the query's value as returned (None = an empty result; NaN/Inf
as they came; the policy applies KEDA's ignoreNullValues), or the name goes in `obs.errors` when the
query failed (an outage is never read as 0). The fleet aggregates are filled the way the simulator
fills them (simulator/autoscaling.build_observation): sums of the waiting/running gauges, the mean KV
usage, rates over the window, TTFT/TPOT/ITL percentiles 50/90/99 from the bucket rates. An aggregate
whose query failed stays None and its field name (e.g. "arrival_rate", "ttft_p") goes in `obs.errors`
too, so the controller counts it as a source failure. `source.last_errors` keeps every message.
"""

from __future__ import annotations

import math
from typing import Protocol

from autoscaler.observation import AGGREGATES, Observation
from autoscaler.prometheus import QueryError
from controlplane.sources.names import candidates, format_duration, promql
from promql.functions import bucket_quantile
from simulator.autoscaling import PERCENTILES
from simulator.scenario import Scenario

Vector = list[tuple[dict[str, str], float]]  # an instant-query answer: (labels, value) per series
DEFAULT_WINDOW = Scenario.rate_window  # the simulator's rate window: same lag live as simulated

_HISTOGRAM_FIELD = {"ttft": "ttft_p", "tpot": "tpot_p", "itl": "itl_p"}


class MetricSource(Protocol):
    def observe(self, spec, now: float, current: int, ready: int | None = None) -> Observation:
        """What the policy of `spec` (an autoscaler.spec.Spec, or None: aggregates only) sees now."""


def needed(spec, aggregates) -> tuple[str, ...]:
    """The aggregate groups to read: `aggregates` when given ("all" = every one), else those the policy's
    registered type declares (autoscaler.registry; keda and hpa read only their triggers)."""
    if aggregates == "all" or (aggregates is None and spec is None):
        return AGGREGATES
    if aggregates is not None:
        unknown = sorted(set(aggregates) - set(AGGREGATES))
        if unknown:
            raise ValueError(f"aggregates: unknown {', '.join(unknown)} (known: {', '.join(AGGREGATES)})")
        return tuple(aggregates)
    return spec.type.reads


class MissingMetric(Exception):
    """The engines do not export the metric an aggregate reads (known absent, not an outage)."""


def single_value(vec: Vector) -> float | None:
    """KEDA's reading of a query result: empty -> None, one sample -> its value, more -> an error."""
    if len(vec) == 0:
        return None
    if len(vec) > 1:
        raise QueryError(f"prometheus query returned multiple elements ({len(vec)})")
    return float(vec[0][1])


class QuerySource:
    """Fills an Observation from PromQL answers; subclasses say how a query is answered."""

    def __init__(self, engine: str = "vllm", window: float = DEFAULT_WINDOW, selector: str = "",
                 aggregates=None):
        candidates("requests", engine)  # validates the engine name
        if window <= 0:
            raise ValueError(f"window: must be > 0 seconds, got {window}")
        self.engine = engine
        self.window = float(window)
        self.selector = selector
        self.aggregates = aggregates
        self.last_errors: dict[str, str] = {}

    # -- what a subclass provides ------------------------------------------------------------------
    def query(self, text: str, trigger=None) -> Vector:
        """The instant-query answer; raises QueryError (failed) or ValueError (unsupported query)."""
        raise NotImplementedError

    def begin(self) -> None:
        """Called once at the start of each observe (a scrape round, a reset of per-round state)."""

    def engine_for_aggregates(self) -> str:
        return self.engine

    def missing(self, name: str) -> str | None:
        """Why `name` cannot be read (known absent), or None when it may be there."""
        return None

    # -- the Observation -----------------------------------------------------------------------------
    def observe(self, spec, now: float, current: int, ready: int | None = None) -> Observation:
        starting = max(0, current - ready) if ready is not None else 0
        obs = Observation(now, current, ready, starting_replicas=starting)
        self.last_errors = {}
        self.begin()
        for trig in spec.triggers if spec is not None else []:
            try:
                obs.metrics[trig.name] = single_value(self.query(trig.query, trig))
            except (QueryError, ValueError) as exc:
                obs.errors.add(trig.name)
                self.last_errors[trig.name] = f"trigger {trig.name!r}: {exc}"
        for group in needed(spec, self.aggregates):
            self._aggregate(obs, group)
        return obs

    def _read(self, aggregate: str) -> Vector:
        """The answer for the first candidate name with data; empty when none has any."""
        kind, names = candidates(aggregate, self.engine_for_aggregates())
        window = format_duration(self.window)
        reasons = []
        for name in names:
            vec = self.query(promql(kind, name, self.selector, window))
            if vec:
                return vec
            why = self.missing(name + ("_bucket" if kind == "buckets" else ""))
            if why is not None:
                reasons.append(why)
        if reasons and len(reasons) == len(names):
            raise MissingMetric("; ".join(reasons))
        return []

    def _total(self, aggregate: str) -> float:
        vec = self._read(aggregate)
        return single_value(vec) if vec else 0.0  # a sum over no replica is 0, as in the simulator

    def _aggregate(self, obs: Observation, group: str) -> None:
        fields = {"mean_tokens": "mean_prompt_tokens"}.get(group, _HISTOGRAM_FIELD.get(group, group))
        try:
            if group == "arrival_rate":
                obs.arrival_rate = self._total("requests")
            elif group == "mean_tokens":
                done = obs.arrival_rate if obs.arrival_rate is not None else self._total("requests")
                if done > 0:
                    obs.mean_prompt_tokens = self._total("prompt_tokens") / done
                    obs.mean_output_tokens = self._total("output_tokens") / done
            elif group in ("num_waiting", "num_running"):
                setattr(obs, group, self._total(group))
            elif group == "kv_usage":
                vec = self._read("kv_usage")
                obs.kv_usage = single_value(vec) if vec else None
            else:
                table = getattr(obs, fields)
                buckets = [(float(lb["le"]), v) for lb, v in self._read(group) if "le" in lb]
                for p in PERCENTILES:
                    q = bucket_quantile(p / 100, buckets)
                    if not math.isnan(q):
                        table[p] = q
        except MissingMetric as exc:  # the engine does not export it: known, not an outage
            self.last_errors[fields] = f"{fields}: {exc}"
        except (QueryError, ValueError) as exc:
            obs.errors.add(fields)
            self.last_errors[fields] = f"{fields}: {exc}"
