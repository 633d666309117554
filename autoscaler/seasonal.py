"""A learned time-of-day (and day-of-week) profile of the arrival rate, and the forecast that blends it.

The profile is a few numbers a bin: an exponentially weighted mean of the rate seen in each time-of-day
bin of `period` seconds (and, with `weekly`, in each bin of each of seven periods), learned online from
the policy's own observations. It is plain lists, so it persists with the policy's state and a
replayed history trains it the same way live observations do.

    profile = Profile(period=86400, bins=96)
    profile.observe(t, rate)                      # every poll
    profile.forecast(now, rate_now, at)           # the rate at `at`, scaled to today's level

The forecast is shape, not level: the profile's ratio between `at` and `now`, times the rate now, so a
day 10% busier than the ones learned is forecast 10% busier. None until both bins have been seen.
"""

from __future__ import annotations

import math


class Profile:
    def __init__(self, period: float = 86400.0, bins: int = 96, weekly: bool = False, alpha: float = 0.3):
        if period <= 0 or bins < 1:
            raise ValueError(f"seasonal profile: period must be > 0 and bins >= 1, got {period} and {bins}")
        self.period, self.bins, self.weekly, self.alpha = float(period), int(bins), weekly, alpha
        self.day = [0.0] * self.bins  # mean rate per time-of-day bin
        self.day_n = [0] * self.bins  # periods that contributed to each bin
        self.week = [0.0] * (7 * self.bins) if weekly else []
        self.week_n = [0] * (7 * self.bins) if weekly else []
        self.cur: list[float] = []  # [absolute bin index, sum of rates, samples] of the bin being filled

    def _index(self, t: float) -> int:
        return int(math.floor(t / self.period * self.bins))

    def observe(self, t: float, rate: float) -> None:
        """One rate sample; a bin's mean is folded into the profile when time leaves that bin."""
        k = self._index(t)
        if self.cur and int(self.cur[0]) != k:
            self._fold()
        if not self.cur:
            self.cur = [float(k), 0.0, 0.0]
        self.cur[1] += rate
        self.cur[2] += 1

    def _fold(self) -> None:
        k, total, n = int(self.cur[0]), self.cur[1], self.cur[2]
        self.cur = []
        if n <= 0:
            return
        mean = total / n
        for table, counts, i in ((self.day, self.day_n, k % self.bins),
                                 (self.week, self.week_n, k % (7 * self.bins))):
            if not counts:
                continue
            # the first period sets the bin, later ones move it by alpha (day-to-day noise averages out)
            table[i] = mean if counts[i] == 0 else table[i] + self.alpha * (mean - table[i])
            counts[i] += 1

    def level(self, t: float) -> float | None:
        """The learned rate at time t (interpolated between bin centres), None where not yet learned."""
        x = t / self.period * self.bins - 0.5
        k0 = int(math.floor(x))
        w = x - k0
        a, b = self._bin(k0), self._bin(k0 + 1)
        if a is None or b is None:
            return a if b is None else b
        return a + w * (b - a)

    def _bin(self, k: int) -> float | None:
        if self.weekly and self.week_n[k % (7 * self.bins)]:
            return self.week[k % (7 * self.bins)]
        i = k % self.bins
        return self.day[i] if self.day_n[i] else None

    def forecast(self, now: float, rate_now: float, at: float) -> float | None:
        """The rate at `at`: the profile's shape from now to then, at today's level (rate_now)."""
        p_now, p_at = self.level(now), self.level(at)
        if p_now is None or p_at is None or p_now <= 0:
            return None
        return rate_now * p_at / p_now

    def state_dict(self) -> dict:
        return {"period": self.period, "bins": self.bins, "day": self.day, "day_n": self.day_n,
                "week": self.week, "week_n": self.week_n, "cur": self.cur}

    def load_state_dict(self, state: dict) -> None:
        """A saved profile of the same period and bins (another shape is ignored: it would misplace bins)."""
        if float(state.get("period", -1)) != self.period or int(state.get("bins", -1)) != self.bins:
            return
        self.day = [float(x) for x in state["day"]]
        self.day_n = [int(x) for x in state["day_n"]]
        if self.weekly and len(state.get("week", [])) == 7 * self.bins:
            self.week = [float(x) for x in state["week"]]
            self.week_n = [int(x) for x in state["week_n"]]
        self.cur = [float(x) for x in state.get("cur", [])]


def train(profile: Profile, history) -> Profile:
    """Feeds a recorded history of (time, arrival rate) pairs, oldest first, into the profile."""
    for t, rate in history:
        if rate is not None and not math.isnan(rate):
            profile.observe(float(t), float(rate))
    return profile
