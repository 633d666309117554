"""The autoscaler in the loop: each pool's policy, the Observation it reads, and its simpy process.

Every policy is an `autoscaler` policy (fixed and schedule included) and every tick goes through
autoscaler.reconcile, the step the live controller runs too; only the edges are the simulator's: the
Observation is what Prometheus would answer at that moment (gauges from the last scrape, rates and
histogram quantiles over the scenario's rate window, so metric lag is part of the simulation) and
the target is the simulated pool. A trigger's query is PromQL, evaluated over the scraped series
(and the recording rules' output) as Prometheus would, and read as KEDA's Prometheus scaler reads
the answer: empty -> no value, one sample -> its value, more -> an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoscaler.observation import Observation
from autoscaler.policy import Policy
from autoscaler.reconcile import reconcile
from autoscaler.schedule import FixedPolicy, SchedulePolicy
from promql import Evaluator, PromQLError, compile_query
from simulator.metrics import quantile_of
from simulator.replica_metrics import LAYOUT
from simulator.steptime import seconds, to_ps

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass
class PoolPolicy:
    """A pool's policy and what the simulator must answer for it."""

    policy: Policy
    triggers: list = field(default_factory=list)  # the spec's KEDA-style triggers
    reads_metrics: bool = True  # fixed and schedule read only the clock and the replica count
    queries: list = field(default_factory=list)  # (trigger name, compiled query)
    matched: set = field(default_factory=set)  # triggers whose query returned a sample (trigger_watch)
    evaluations: int = 0  # times the queries were evaluated


def make_pool_policy(spec, latency_model) -> PoolPolicy:
    """The policy of one pool, from the scenario's `autoscaler` entry."""
    cfg = spec.autoscaler
    if cfg is None:
        return PoolPolicy(FixedPolicy(spec.replicas), reads_metrics=False)
    if cfg["kind"] == "fixed":
        return PoolPolicy(FixedPolicy(cfg["replicas"]), reads_metrics=False)
    if cfg["kind"] == "schedule":
        policy = SchedulePolicy(cfg["steps"], spec.replicas, cfg["polling_interval"])
        return PoolPolicy(policy, reads_metrics=False)
    from autoscaler.spec import make_policy
    from simulator.latency import load_latency_model

    parsed = cfg["spec"]  # validated when the scenario was loaded
    model = load_latency_model(cfg["latency_model"]) if cfg.get("latency_model") else latency_model
    queries = []
    for trig in parsed.triggers:
        try:
            queries.append((trig.name, compile_query(trig.query)))
        except PromQLError as exc:
            raise ValueError(f"pool {spec.name}: trigger {trig.name!r}: {exc}") from None
    return PoolPolicy(make_policy(parsed, latency_model=model), list(parsed.triggers), queries=queries)


class PoolTarget:
    """The scale target of the reconcile step: a simulated pool."""

    def __init__(self, fleet, pool):
        self.fleet, self.pool = fleet, pool

    def scale(self, desired: int, reason: str) -> None:
        self.fleet.set_desired(self.pool, desired, reason)


def autoscaler_process(fleet, pool):
    """The pool's policy, evaluated every polling interval."""
    target = PoolTarget(fleet, pool)
    interval = to_ps(pool.policy.policy.polling_interval)
    while True:
        reconcile(pool.policy.policy, build_observation(fleet, pool), target)
        yield fleet.env.timeout(interval)


def keda_value(value) -> float | None:
    """An answer as KEDA's Prometheus scaler reads it: a number, None for an empty result."""
    if isinstance(value, float):
        return value
    if len(value) > 1:
        raise PromQLError(f"prometheus query returned multiple elements ({len(value)})")
    return value[0][1] if value else None


def trigger_values(fleet, queries, t: float, obs: Observation) -> None:
    """Each trigger's query evaluated at t over the store; a failing query is that trigger's error."""
    ev = Evaluator(fleet.store, default_step=round(fleet.sc.evaluation_interval * 1000))
    t_ms = round(t * 1000)
    for name, tree in queries:
        try:
            obs.metrics[name] = keda_value(ev.eval(tree, t_ms))
        except PromQLError:
            obs.errors.add(name)


def build_observation(fleet, pool) -> Observation:
    """What the pool's policy sees now."""
    t = seconds(fleet.env.now)
    if not pool.policy.reads_metrics:
        return Observation(time=t, current_replicas=pool.desired)
    window = fleet.sc.rate_window
    store = fleet.store
    keys = [k for k in store.series if k[0] == pool.index]
    live = [k for k in keys if k in store.gauges]
    rates = store.rate(keys, t, window)
    waiting = store.gauge(live, "waiting", t)
    running = store.gauge(live, "running", t)
    kv = store.gauge(live, "kv_usage", t)
    done = rates[LAYOUT["request_success"]]
    obs = Observation(
        time=t,
        current_replicas=pool.desired,
        ready_replicas=pool.count("ready"),
        arrival_rate=float(rates[LAYOUT["arrivals"]]),
        mean_prompt_tokens=float(rates[LAYOUT["request_prompt_tokens_sum"]] / done) if done > 0 else None,
        mean_output_tokens=float(rates[LAYOUT["request_output_tokens_sum"]] / done) if done > 0 else None,
        num_waiting=float(sum(waiting)) + (len(fleet.backlog) if pool.index == 0 else 0),
        num_running=float(sum(running)),
        kv_usage=float(sum(kv) / len(kv)) if kv else None,
        starting_replicas=pool.count("provisioning"),
        max_batch_seqs=pool.spec.max_num_seqs,
    )
    for name, table in (
        ("time_to_first_token_seconds", obs.ttft_p),
        ("request_time_per_output_token_seconds", obs.tpot_p),
        ("inter_token_latency_seconds", obs.itl_p),
    ):
        for p in PERCENTILES:
            v = quantile_of(rates, name, p / 100)
            if not math.isnan(v):
                table[p] = v
    if pool.policy.queries:
        pool.policy.evaluations += 1
        trigger_values(fleet, pool.policy.queries, t, obs)
        # a trigger that returned a sample (simulator.trigger_watch reports those that never did)
        pool.policy.matched.update(n for n, _ in pool.policy.queries if obs.metrics.get(n) is not None)
    return obs
