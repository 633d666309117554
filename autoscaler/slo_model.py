"""Model-based SLO headroom: the fewest replicas whose predicted TTFT and TPOT percentiles meet the SLOs.

From a step-time model (the calibrated simulator.latency model, passed in by the caller: autoscaler
imports none of our packages), the arrival rate and the mean prompt/output lengths, each replica is a
continuous-batching server with the per-replica rate lam = rate / n:

* decode: B sequences in the running batch, B = lam * O * tpot (Little's law), tpot = d(B) / (1 - rho_p),
  d(B) = one decode step of B sequences, rho_p = lam * S the share of time spent in prefill steps;
  solved as a fixed point; no solution with B <= maxBatchSeqs and rho_p < 1 means "overloaded".
* TTFT: prefills queue FCFS and are scheduled ahead of decode steps: M/G/1 with vacations,
  mean wait W0 = lam E[S^2] / (2 (1 - rho_p)), tail P(W > t) ~ rho_p exp(-rho_p t / W0), plus one decode
  step of residual and the prefill of a percentile-long prompt.

The policy looks ahead by the startup delay: a least-squares trend of the arrival rate over the last
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
counting noise of a fast-window rate, sqrt(rate / fast_window). A
queue backlog adds num_waiting / drainSeconds to the rate. Scale-up is immediate; scale-down waits
scaleDownDelay seconds (the highest recommendation of that window wins), like the HPA's stabilization.
Spec names: trendWindowSeconds, burstRise, burstZ, burstSlope, dropOnFall.

Three opt-in inputs (all off by default, then the policy is exactly the one above):

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
from typing import Protocol

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.seasonal import Profile
from autoscaler.slo import SloTarget


class StepTimeModel(Protocol):
    """What the policy needs from simulator.latency.LatencyModel: one engine step in milliseconds."""

    def step_ms(
        self, prefill_tokens: float, prefill_context: float, decode_seqs: float, decode_context: float
    ) -> float: ...


@dataclass
class Prediction:
    ttft: float  # seconds at the SLO percentile (inf = overloaded)
    tpot: float  # seconds
    batch: float  # sequences in the running batch
    rho_prefill: float


OVERLOADED = Prediction(math.inf, math.inf, math.inf, math.inf)


def quantile_factor(q: float, cv: float) -> float:
    """Length at quantile q over the mean, for a length mix with coefficient of variation cv
    (cv = 1 is the exponential quantile -ln(1 - q); cv = 0 is a fixed length)."""
    return max(0.0, 1.0 + cv * (-math.log(1.0 - q) - 1.0))


def predict(
    model: StepTimeModel,
    rate_per_replica: float,
    prompt: float,
    output: float,
    ttft_q: float = 0.9,
    max_batch: int = 256,
    prompt_cv: float = 1.0,
) -> Prediction:
    """Predicted TTFT (at quantile ttft_q) and mean TPOT for one replica serving rate_per_replica req/s."""
    lam = max(rate_per_replica, 0.0)
    prefill_s = model.step_ms(prompt, prompt, 0, 0) / 1000.0
    rho_p = lam * prefill_s
    if rho_p >= 1.0:
        return OVERLOADED
    ctx = prompt + output / 2.0  # mean KV length of a decoding sequence

    def decode_s(b: float) -> float:
        b = max(b, 1.0)
        return model.step_ms(0, 0, b, b * ctx) / 1000.0

    tpot = decode_s(1.0) / (1.0 - rho_p)
    batch = lam * output * tpot
    for _ in range(60):  # the smallest fixed point, approached from below
        tpot_new = decode_s(batch) / (1.0 - rho_p)
        batch_new = lam * output * tpot_new
        if batch_new > max_batch:
            return OVERLOADED
        done = abs(batch_new - batch) <= 1e-4 * max(1.0, batch)
        tpot, batch = tpot_new, batch_new
        if done:
            break
    else:
        return OVERLOADED  # no fixed point: the batch keeps growing
    step = decode_s(batch) if lam > 0 else 0.0
    es2 = prefill_s**2 * (1.0 + prompt_cv**2)
    w0 = lam * es2 / (2.0 * (1.0 - rho_p))
    tail = 1.0 - ttft_q
    wait = 0.0 if rho_p <= tail or w0 <= 0 else (w0 / rho_p) * math.log(rho_p / tail)
    long_prompt = prompt * quantile_factor(ttft_q, prompt_cv)
    ttft = wait + step + model.step_ms(long_prompt, long_prompt, 0, 0) / 1000.0
    return Prediction(ttft, tpot, batch, rho_p)


def meets(p: Prediction, slos: list[SloTarget], margin: float) -> bool:
    for slo in slos:
        value = p.ttft if slo.metric == "ttft" else p.tpot
        if value > slo.seconds * (1.0 - margin):
            return False
    return True


def replicas_needed(
    model: StepTimeModel,
    rate: float,
    prompt: float,
    output: float,
    slos: list[SloTarget],
    margin: float = 0.15,
    lo: int = 1,
    hi: int = 1000,
    max_batch: int = 256,
    prompt_cv: float = 1.0,
) -> int:
    """Smallest n in [lo, hi] meeting every SLO (hi when none does); binary search, latency falls with n."""
    if rate <= 0:
        return lo
    q = max((s.percentile / 100.0 for s in slos if s.metric == "ttft"), default=0.9)
    lo = max(lo, 1)

    def ok(n: int) -> bool:
        return meets(predict(model, rate / n, prompt, output, q, max_batch, prompt_cv), slos, margin)

    if ok(lo):
        return lo
    if not ok(hi):
        return hi
    a, b = lo, hi  # ok(a) false, ok(b) true
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (a, mid) if ok(mid) else (mid, b)
    return b


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


class SloModelPolicy(Policy):
    def __init__(
        self,
        slos: list[SloTarget],
        latency_model: StepTimeModel,
        min_replicas: int = 1,
        max_replicas: int = 100,
        polling_interval: float = 15.0,
        startup_delay: float = 120.0,
        margin: float = 0.15,
        forecast_window: float = 300.0,
        scale_down_delay: float = 180.0,
        max_batch_seqs: int = 256,
        prompt_cv: float = 1.0,
        drain_seconds: float = 60.0,
        trend_window: float = 60.0,
        burst_rise: float = 0.2,
        burst_z: float = 4.0,
        burst_slope: str = "trend",
        drop_on_fall: bool = False,
        arrivals_query: str = "",
        queue_query: str = "",
        fast_window: float = 15.0,
        season_period: float = 0.0,
        season_bins: int = 96,
        season_weekly: bool = False,
        season_weight: float = 0.5,
        batch_arrivals_query: str = "",
        batch_queue_query: str = "",
        batch_deadline: float = 3600.0,
        burst_noise_floor: bool = False,
    ):
        if not slos:
            raise ValueError("spec.slo: the sloModel policy needs at least one SLO (ttft or tpot)")
        if latency_model is None:
            raise ValueError("spec.policy.sloModel: needs a latency model (pass latency_model=...)")
        self.slos, self.model = slos, latency_model
        self.min_replicas, self.max_replicas, self.polling_interval = (
            min_replicas,
            max_replicas,
            polling_interval,
        )
        self.startup_delay, self.margin, self.forecast_window = startup_delay, margin, forecast_window
        self.scale_down_delay, self.max_batch, self.prompt_cv = scale_down_delay, max_batch_seqs, prompt_cv
        self.drain_seconds, self.trend_window, self.burst_rise = drain_seconds, trend_window, burst_rise
        if burst_slope not in ("trend", "last", "onset"):
            raise ValueError(f"spec.policy.sloModel.burstSlope: must be trend, last or onset, not "
                             f"{burst_slope!r}")
        self.burst_z, self.burst_slope, self.drop_on_fall = burst_z, burst_slope, drop_on_fall
        self.burst_noise_floor = burst_noise_floor
        self.arrivals_query, self.queue_query, self.fast_window = arrivals_query, queue_query, fast_window
        self.batch_arrivals_query, self.batch_queue_query = batch_arrivals_query, batch_queue_query
        self.season_period, self.season_bins, self.season_weekly = season_period, season_bins, season_weekly
        self.fast, self.batch = bool(arrivals_query), bool(batch_arrivals_query)
        self.batch_deadline, self.season_weight = batch_deadline, season_weight
        self.profile = Profile(season_period, season_bins, season_weekly) if season_period > 0 else None
        self.rates: list[list[float]] = []  # [time, arrival rate]
        self.recs: list[list[float]] = []  # [time, recommendation]
        self.counts: list[list[float]] = []  # [time, arrivals counter, batch arrivals counter]

    def state_dict(self) -> dict:
        state = {"rates": self.rates, "recs": self.recs}
        if self.fast:
            state["counts"] = self.counts
        if self.profile is not None:
            state["profile"] = self.profile.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rates = [list(x) for x in state.get("rates", [])]
        self.recs = [list(x) for x in state.get("recs", [])]
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
        total = obs.metrics.get("arrivals")
        batch = obs.metrics.get("batch_arrivals") if self.batch else 0.0
        if total is None or batch is None or math.isnan(total) or math.isnan(batch):
            return None
        now = obs.time
        if self.counts and (total < self.counts[-1][1] or batch < self.counts[-1][2]):
            self.counts = []  # a counter reset (the router restarted)
        self.counts.append([now, total, batch])
        self.counts = [c for c in self.counts if c[0] >= now - self.forecast_window - 1e-9]

        def rise(window: float) -> float | None:
            older = [c for c in self.counts if c[0] <= now - window + 1e-9]
            if not older:
                return None
            t0, c0, b0 = older[-1]
            return max(((total - batch) - (c0 - b0)) / (now - t0), 0.0)

        rate, level = rise(self.fast_window), rise(self.trend_window)
        if rate is None:
            return None
        ts, _, bs = self.counts[0]
        return rate, rate if level is None else level, max((batch - bs) / (now - ts), 0.0)

    def demand(self, obs: Observation) -> float:
        """The arrival rate to provision for: now, or forecast at now + startup delay, plus backlog drain.

        Two trends: the long window follows the diurnal curve; the short one catches a burst. The
        short trend is trusted only when it predicts a rise of more than burst_rise over the horizon and
        the rate now is burst_z residual spreads above the long trend: on a steady load a short slope
        is mostly noise. The horizon adds one polling interval: the observed rate is a trailing window
        average and lags the true one."""
        now, rate = obs.time, obs.arrival_rate or 0.0
        fast = self.fast_rates(obs) if self.fast else None
        level, batch_rate = rate, 0.0
        if fast is not None:
            rate, level, batch_rate = fast
        self.rates.append([now, rate])
        self.rates = [r for r in self.rates if r[0] > now - self.forecast_window]
        at = now + self.startup_delay + self.polling_interval
        ahead = linear_forecast(self.rates, now + self.startup_delay) or 0.0
        # on fast signals, a trend of less than a short window's samples has no noise estimate yet
        settled = fast is None or self.rates[0][0] <= now - self.trend_window
        if not settled:
            ahead = level
        if self.profile is not None:
            self.profile.observe(now, rate)
            seasonal = self.profile.forecast(now, linear_forecast(self.rates, now) or rate, at)
            if seasonal is not None:
                ahead = self.season_weight * seasonal + (1.0 - self.season_weight) * ahead
        short = [r for r in self.rates if r[0] > now - self.trend_window - 1e-9]
        burst = linear_forecast(short, at) or 0.0
        past = self.rates[:-1]  # is the rate now an outlier of the long trend, not noise around it?
        base = linear_forecast(past, now) if settled else None
        if self.burst_slope == "onset" and base is not None:  # the trend before the short window's samples
            ramp = onset_ramp(self.rates, [r for r in past if r[0] <= now - self.trend_window] or past)
        else:
            ramp = []
        if len(ramp) >= 3:
            burst = max(burst, linear_forecast(ramp, at) or 0.0)
        elif self.burst_slope != "trend" and len(self.rates) >= 2:
            # the last polling interval's slope; with fast signals, over one fast window (the rates of
            # consecutive polls overlap and their difference is mostly noise)
            gap = self.fast_window if fast is not None else 0.0
            (t1, r1) = self.rates[-1]
            (t0, r0) = next((r for r in reversed(self.rates[:-1]) if r[0] <= t1 - gap + 1e-9), self.rates[-2])
            if t1 > t0:
                burst = max(burst, r1 + (r1 - r0) / (t1 - t0) * (at - t1))
        noise = spread(past)
        if self.burst_noise_floor and fast is not None and base is not None:
            # a few minutes of residuals can understate a low rate's counting noise: a rate counted
            # over w seconds varies by at least sqrt(rate / w) (Poisson)
            noise = max(noise, math.sqrt(max(base, 0.0) / self.fast_window))
        if (
            burst > rate * (1.0 + self.burst_rise)
            and base is not None
            and rate > base + self.burst_z * noise
        ):
            ahead = max(ahead, burst)
        elif self.drop_on_fall and base is not None and rate < base and len(short) >= 3:
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
            rate += batch_rate + batch_queue / (self.batch_deadline / 2.0)
        return rate + waiting / self.drain_seconds

    def decide(self, obs: Observation) -> Decision:
        no_mix = obs.mean_prompt_tokens is None or obs.mean_output_tokens is None
        # a fleet that served and is now idle finishes no request, so it has no length mix; it needs
        # none to size for nothing (before any decision the count given at start is kept instead)
        idle = obs.arrival_rate == 0 and not obs.num_waiting and bool(self.recs)
        if obs.arrival_rate is None or (no_mix and not idle):
            return Decision(obs.current_replicas, False, "sloModel: no arrival rate / length mix, no change")
        rate = 0.0 if no_mix else self.demand(obs)
        need = self.min_replicas if rate <= 0 else replicas_needed(
            self.model,
            rate,
            obs.mean_prompt_tokens,
            obs.mean_output_tokens,
            self.slos,
            self.margin,
            max(self.min_replicas, 1),
            self.max_replicas,
            obs.max_batch_seqs or self.max_batch,
            self.prompt_cv,
        )
        now = obs.time
        self.recs.append([now, need])
        self.recs = [r for r in self.recs if r[0] > now - self.scale_down_delay] or self.recs[-1:]
        desired = int(max(r[1] for r in self.recs))  # scale down only after the delay window
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        return Decision(desired, rate > 0, f"sloModel: provision for {rate:.2f} req/s -> {need} replicas")
