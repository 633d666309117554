"""The autoscaler in the loop: scenario policies, and the Observation built from scraped metrics.

`fixed` and `schedule` policies live here (they need nothing from the autoscaler package); specs (a
KEDA ScaledObject or an InferenceAutoscaler, from a file or inline) go through autoscaler.spec. The
Observation is what Prometheus would answer at that moment: gauges from the last scrape, rates and
histogram quantiles over the scenario's rate window, so metric lag is part of the simulation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from simulator.metrics import LAYOUT, quantile_of

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class SimpleDecision:
    desired_replicas: int
    active: bool
    reason: str


class FixedPolicy:
    """Keeps the pool at a constant size."""

    needs_observation = False

    def __init__(self, replicas: int):
        self.replicas = replicas
        self.polling_interval = 3600.0

    def decide(self, obs) -> SimpleDecision:
        return SimpleDecision(self.replicas, self.replicas > 0, f"fixed at {self.replicas}")


class SchedulePolicy:
    """A time schedule [(at_s, replicas)]; before the first entry the pool keeps its initial size."""

    needs_observation = False

    def __init__(self, steps: list[tuple[float, int]], initial: int, polling_interval: float = 1.0):
        self.steps = steps
        self.initial = initial
        self.polling_interval = polling_interval

    def decide(self, obs) -> SimpleDecision:
        n = self.initial
        for at, replicas in self.steps:
            if obs.time >= at:
                n = replicas
        return SimpleDecision(n, n > 0, f"schedule: {n} at t={obs.time:g}s")


class _Obs:
    """The minimal observation fixed/schedule policies read."""

    def __init__(self, time: float, current: int):
        self.time = time
        self.current_replicas = current


def make_pool_policy(spec, latency_model):
    """The policy object for one pool (anything with decide(obs) and polling_interval)."""
    cfg = spec.autoscaler
    if cfg is None:
        return FixedPolicy(spec.replicas)
    if cfg["kind"] == "fixed":
        return FixedPolicy(cfg["replicas"])
    if cfg["kind"] == "schedule":
        return SchedulePolicy(cfg["steps"], spec.replicas, cfg["polling_interval"])
    from autoscaler.spec import load_spec, make_policy

    where = cfg["where"]
    try:
        if "path" in cfg:
            path = Path(cfg["path"])
            if not path.exists():
                raise FileNotFoundError(f"{where}.spec: file not found: {path}")
            parsed = load_spec(path.read_text())
        else:
            parsed = load_spec(cfg["inline"])
    except ValueError as exc:
        raise ValueError(f"{where}.spec: {exc}") from None
    model = latency_model
    if cfg.get("latency_model"):
        from simulator.fleet import load_latency_model

        model = load_latency_model(cfg["latency_model"])
    policy = make_policy(parsed, latency_model=model)
    policy.spec = parsed
    policy.needs_observation = True
    return policy


_QUANTILE = re.compile(r"histogram_quantile\(\s*([0-9.]+)\s*,.*?(?:vllm:)?([a-z_]+)_bucket", re.S)


def query_value(query: str, rates, obs) -> float | None:
    """The few PromQL shapes the simulator answers itself: histogram_quantile over a vLLM histogram;
    everything else (sum/avg of a gauge, rates) is answered by autoscaler.signals."""
    m = _QUANTILE.search(query)
    if m is None:
        return None
    q, hist = float(m.group(1)), m.group(2)
    if hist + "_bucket" not in LAYOUT:
        raise ValueError(f"trigger query {query!r}: unknown histogram {hist!r}")
    v = quantile_of(rates, hist, q)
    return None if math.isnan(v) else v


def build_observation(fleet, pool):
    """What the pool's policy sees now."""
    t = fleet.env.now / 1e12
    policy = pool.policy
    if not getattr(policy, "needs_observation", True):
        return _Obs(t, pool.desired)
    from autoscaler.observation import Observation

    window = fleet.sc.rate_window
    keys = [k for k in fleet.store.series if k[0] == pool.index]
    live = [k for k in keys if k in fleet.store.gauges]
    rates = fleet.store.rate(keys, t, window)
    waiting = fleet.store.gauge(live, "waiting", t)
    running = fleet.store.gauge(live, "running", t)
    kv = fleet.store.gauge(live, "kv_usage", t)
    done = rates[LAYOUT["request_success"]]
    ready = pool.count("ready")
    obs = Observation(
        time=t,
        current_replicas=pool.desired,
        ready_replicas=ready,
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
    spec = getattr(policy, "spec", None)
    triggers = spec.triggers if spec is not None else []
    if triggers:
        from autoscaler.signals import fill_trigger_metrics

        for trig in triggers:
            v = query_value(trig.query, rates, obs)
            if v is not None:
                obs.metrics[trig.name] = v
        fill_trigger_metrics([tr for tr in triggers if tr.name not in obs.metrics], obs)
    return obs
