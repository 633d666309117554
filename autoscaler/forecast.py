"""Demand forecasting for the model-based policy: the arrival rate to provision for, from the rates seen.

    demand = Demand(DemandOptions(burst_slope="last"), startup_delay=120, polling_interval=15)
    rate = demand.rate(obs)          # req/s: now, or forecast at now + startup delay, plus backlog drain
    demand.state_dict()              # the samples it remembers (JSON-able), load_state_dict() to resume

It looks ahead by the startup delay: a least-squares trend of the arrival rate over the last
forecastWindow seconds predicts the rate when a replica ordered now becomes ready; a short trend over
the last trend_window seconds, trusted only on a rise above burst_rise and well outside the long
trend's noise, catches a burst at its first sample (a 2-minute startup leaves no time to wait for the
long trend). With burst_slope "last" the burst forecast is the larger of that trend and the last
polling interval's slope: a trailing-window rate rises slowest at a burst's start, so a fit over older
samples under-sizes the first order. With drop_on_fall, when the short trend falls and the rate is
below the long trend's fit (a burst's tail, which the long window still extrapolates upward), the
policy provisions for the rate now instead of ordering replicas that would start after the burst. With
burst_slope "onset" the burst forecast is a line through the samples since the burst's onset (the
last sample at or below the long trend), so the first order follows the whole rise so far rather than
one noisy interval. With burst_noise_floor (fast signals), the burst test's spread is at least the
counting noise of a fast-window rate, sqrt(rate / fast_window). A queue backlog adds
num_waiting / drainSeconds to the rate. Spec names: trendWindowSeconds, burstRise, burstZ, burstSlope,
dropOnFall.

Three opt-in inputs (all off by default, then the forecast is exactly the one above):

* fast signals (arrivalsQuery, queueQuery): the router's arrival counter and gateway queue, scraped
  every few seconds, read as triggers named "arrivals" and "queue". The rate now is the counter's rise
  over the last fastWindowSeconds instead of a 60-s windowed rate, and the "last" slope is taken over
  that window; the gateway queue joins the backlog. When the counter is missing the 60-s path is used.
* a learned seasonal profile (seasonPeriodSeconds > 0, autoscaler.seasonal): the look-ahead forecast is
  seasonWeight x the profile's shape (at today's level) + the rest x the long trend.
* a batch band (batchArrivalsQuery, batchQueueQuery, batchDeadlineSeconds): the trend, burst test and
  profile follow the interactive rate (total - batch); batch is provisioned at its mean rate over the
  forecast window plus its gateway queue drained within half its deadline, so during a burst the
  gateway defers batch instead of the policy buying capacity for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.observation import Observation
from autoscaler.seasonal import Profile

BASELINES = ("window", "beforeTrend")


@dataclass(frozen=True)
class DemandOptions:
    """The forecast's settings (spec names in autoscaler/policies/slo_model.py)."""

    forecast_window: float = 300.0
    drain_seconds: float = 60.0
    trend_window: float = 60.0
    burst_rise: float = 0.2
    burst_z: float = 4.0
    burst_slope: str = "trend"
    drop_on_fall: bool = False
    arrivals_query: str = ""
    queue_query: str = ""
    fast_window: float = 15.0
    season_period: float = 0.0
    season_bins: int = 96
    season_weekly: bool = False
    season_weight: float = 0.5
    batch_arrivals_query: str = ""
    batch_queue_query: str = ""
    batch_deadline: float = 3600.0
    burst_noise_floor: bool = False
    burst_baseline: str = "window"

    def __post_init__(self):
        if self.burst_slope not in ("trend", "last", "onset"):
            raise ValueError(f"spec.policy.sloModel.burstSlope: must be trend, last or onset, not "
                             f"{self.burst_slope!r}")
        if self.burst_baseline not in BASELINES:
            raise ValueError(f"spec.policy.sloModel.burstBaseline: must be one of {', '.join(BASELINES)}, "
                             f"not {self.burst_baseline!r}")


def linear_forecast(samples: list[list[float]], at: float) -> float | None:
    """Least-squares line through [time, value] samples, evaluated at time `at`."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(s[0] for s in samples) / n
    mv = sum(s[1] for s in samples) / n
    var = sum((s[0] - mt) ** 2 for s in samples)
    if var <= 0:
        return mv
    slope = sum((s[0] - mt) * (s[1] - mv) for s in samples) / var
    return mv + slope * (at - mt)


def onset_ramp(rates: list[list[float]], past: list[list[float]]) -> list[list[float]]:
    """The samples since the rate last sat at or below the trend (a line fit over `past`): a burst's own
    ramp, from its onset. A line through them sizes a burst with the slope of its whole rise so far,
    where the last interval's slope, read just as the rate clears the noise test, is mostly that noise."""
    n = len(past)
    if n < 3:
        return []
    mt = sum(r[0] for r in past) / n
    mv = sum(r[1] for r in past) / n
    var = sum((r[0] - mt) ** 2 for r in past)
    slope = sum((r[0] - mt) * (r[1] - mv) for r in past) / var if var > 0 else 0.0
    i = len(rates)
    while i > 0 and rates[i - 1][1] > mv + slope * (rates[i - 1][0] - mt):
        i -= 1
    return rates[max(i - 1, 0):]


def spread(samples: list[list[float]]) -> float:
    """Root-mean-square residual of [time, value] samples around their least-squares line."""
    if len(samples) < 3:
        return 0.0
    res = [s[1] - (linear_forecast(samples, s[0]) or 0.0) for s in samples]
    return math.sqrt(sum(r * r for r in res) / len(res))


class Demand:
    """The arrival rate to provision for, and the samples (rates, counters, a seasonal profile) it needs."""

    def __init__(self, options: DemandOptions, startup_delay: float = 120.0, polling_interval: float = 15.0):
        o = self.options = options
        self.startup_delay, self.polling_interval = startup_delay, polling_interval
        self.fast, self.batch = bool(o.arrivals_query), bool(o.batch_arrivals_query)
        seasonal = o.season_period > 0
        self.profile = Profile(o.season_period, o.season_bins, o.season_weekly) if seasonal else None
        self.rates: list[list[float]] = []  # [time, arrival rate]
        self.counts: list[list[float]] = []  # [time, arrivals counter, batch arrivals counter]
        self.bursting = False  # the last rate() saw a burst (its forecast is the burst's)

    def state_dict(self) -> dict:
        state = {"rates": self.rates}
        if self.fast:
            state["counts"] = self.counts
        if self.profile is not None:
            state["profile"] = self.profile.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rates = [list(x) for x in state.get("rates", [])]
        self.counts = [list(x) for x in state.get("counts", [])]
        if self.profile is not None and "profile" in state:
            self.profile.load_state_dict(state["profile"])

    def fast_rates(self, obs: Observation) -> tuple[float, float, float] | None:
        """(rate now, level, batch mean rate) from the router's counters; None without the counter.

        The rate now is the counter's rise over the last fast_window seconds (interactive only when a
        batch counter is read): the burst test's input. The level, what is provisioned when no burst is
        seen, is its rise over trend_window: as smooth as a 60-s rate but not 15 s old, since read every
        poll, the noisy short rate would set the scale-down window's maximum. The batch rate is the batch
        counter's rise over the whole forecast window."""
        o = self.options
        total = obs.metrics.get("arrivals")
        batch = obs.metrics.get("batch_arrivals") if self.batch else 0.0
        if total is None or batch is None or math.isnan(total) or math.isnan(batch):
            return None
        now = obs.time
        if self.counts and (total < self.counts[-1][1] or batch < self.counts[-1][2]):
            self.counts = []  # a counter reset (the router restarted)
        self.counts.append([now, total, batch])
        self.counts = [c for c in self.counts if c[0] >= now - o.forecast_window - 1e-9]

        def rise(window: float) -> float | None:
            older = [c for c in self.counts if c[0] <= now - window + 1e-9]
            if not older:
                return None
            t0, c0, b0 = older[-1]
            return max(((total - batch) - (c0 - b0)) / (now - t0), 0.0)

        rate, level = rise(o.fast_window), rise(o.trend_window)
        if rate is None:
            return None
        ts, _, bs = self.counts[0]
        return rate, rate if level is None else level, max((batch - bs) / (now - ts), 0.0)

    def rate(self, obs: Observation) -> float:
        """The arrival rate to provision for: now, or forecast at now + startup delay, plus backlog drain.

        Two trends: the long window follows the diurnal curve; the short one catches a burst. The
        short trend is trusted only when it predicts a rise of more than burst_rise over the horizon and
        the rate now is burst_z residual spreads above the long trend: on a steady load a short slope
        is mostly noise. The horizon adds one polling interval: the observed rate is a trailing window
        average and lags the true one."""
        o = self.options
        now, rate = obs.time, obs.arrival_rate or 0.0
        fast = self.fast_rates(obs) if self.fast else None
        level, batch_rate = rate, 0.0
        if fast is not None:
            rate, level, batch_rate = fast
        self.rates.append([now, rate])
        self.rates = [r for r in self.rates if r[0] > now - o.forecast_window]
        at = now + self.startup_delay + self.polling_interval
        ahead = linear_forecast(self.rates, now + self.startup_delay) or 0.0
        # on fast signals, a trend of less than a short window's samples has no noise estimate yet
        settled = fast is None or self.rates[0][0] <= now - o.trend_window
        if not settled:
            ahead = level
        if self.profile is not None:
            self.profile.observe(now, rate)
            seasonal = self.profile.forecast(now, linear_forecast(self.rates, now) or rate, at)
            if seasonal is not None:
                ahead = o.season_weight * seasonal + (1.0 - o.season_weight) * ahead
        short = [r for r in self.rates if r[0] > now - o.trend_window - 1e-9]
        burst = linear_forecast(short, at) or 0.0
        past = self.rates[:-1]  # is the rate now an outlier of the long trend, not noise around it?
        if o.burst_baseline == "beforeTrend":
            # the trend and its noise from the samples before the short window: a ramp's own first samples
            # would tilt the line toward them and widen the spread, hiding the ramp from its own test
            past = [r for r in past if r[0] <= now - o.trend_window]
        base = linear_forecast(past, now) if settled else None
        if o.burst_slope == "onset" and base is not None:  # the trend before the short window's samples
            ramp = onset_ramp(self.rates, [r for r in past if r[0] <= now - o.trend_window] or past)
        else:
            ramp = []
        if len(ramp) >= 3:
            burst = max(burst, linear_forecast(ramp, at) or 0.0)
        elif o.burst_slope != "trend" and len(self.rates) >= 2:
            # the last polling interval's slope; with fast signals, over one fast window (the rates of
            # consecutive polls overlap and their difference is mostly noise)
            gap = o.fast_window if fast is not None else 0.0
            (t1, r1) = self.rates[-1]
            (t0, r0) = next((r for r in reversed(self.rates[:-1]) if r[0] <= t1 - gap + 1e-9), self.rates[-2])
            if t1 > t0:
                burst = max(burst, r1 + (r1 - r0) / (t1 - t0) * (at - t1))
        noise = spread(past)
        if o.burst_noise_floor and fast is not None and base is not None:
            # a few minutes of residuals can understate a low rate's counting noise: a rate counted
            # over w seconds varies by at least sqrt(rate / w) (Poisson)
            noise = max(noise, math.sqrt(max(base, 0.0) / o.fast_window))
        self.bursting = (burst > rate * (1.0 + o.burst_rise) and base is not None
                         and rate > base + o.burst_z * noise)
        if self.bursting:
            ahead = max(ahead, burst)
        elif o.drop_on_fall and base is not None and rate < base and len(short) >= 3:
            falling = (linear_forecast(short, now + 1.0) or 0.0) < (linear_forecast(short, now) or 0.0)
            if falling:  # a burst's tail: the long trend still points up, the load is going down
                ahead = min(ahead, level)
        rate = max(level, ahead)
        queue = obs.metrics.get("queue") if self.fast else None
        waiting = (obs.num_waiting or 0.0) + (queue if queue is not None and not math.isnan(queue) else 0.0)
        if self.batch:
            batch_queue = obs.metrics.get("batch_queue")
            batch_queue = 0.0 if batch_queue is None or math.isnan(batch_queue) else batch_queue
            waiting = max(waiting - batch_queue, 0.0)  # batch waits by design; it has its own term
            rate += batch_rate + batch_queue / (o.batch_deadline / 2.0)
        return rate + waiting / o.drain_seconds
