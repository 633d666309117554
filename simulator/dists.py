"""Random distributions named in scenarios: lengths, startup delays, repair times.

A distribution is given as a number (a constant) or a mapping `{dist: NAME, ...params}`. Lognormals
can be given by `mean` and `median` (the published statistics of most traces): median = e^mu and
mean = e^(mu + sigma^2/2), so sigma = sqrt(2 ln(mean/median)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PARAMS = {
    "constant": {"value"},
    "uniform": {"low", "high"},
    "normal": {"mean", "std"},
    "exponential": {"mean"},
    "lognormal": {"mean", "median", "mu", "sigma"},
    "gamma": {"mean", "cv"},
    "empirical": {"values"},
}
BOUNDS = {"min", "max", "integer"}


@dataclass
class Dist:
    kind: str
    params: dict
    lo: float | None = None
    hi: float | None = None
    integer: bool = False

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        if self.kind == "constant":
            x = np.full(n, float(p["value"]))
        elif self.kind == "uniform":
            x = rng.uniform(p["low"], p["high"], n)
        elif self.kind == "normal":
            x = rng.normal(p["mean"], p["std"], n)
        elif self.kind == "exponential":
            x = rng.exponential(p["mean"], n)
        elif self.kind == "lognormal":
            mu, sigma = lognormal_params(p)
            x = rng.lognormal(mu, sigma, n)
        elif self.kind == "gamma":
            shape = 1.0 / p["cv"] ** 2
            x = rng.gamma(shape, p["mean"] / shape, n)
        else:  # empirical: resample the given values (a trace's mix)
            values = np.asarray(p["values"], dtype=float)
            x = values[rng.integers(0, len(values), n)]
        if self.integer:
            x = np.rint(x)
        if self.lo is not None or self.hi is not None:
            x = np.clip(x, self.lo, self.hi)
        return x

    def mean(self) -> float:
        """Analytic mean before clipping (used for utilisation estimates)."""
        p = self.params
        if self.kind == "constant":
            return float(p["value"])
        if self.kind == "uniform":
            return (p["low"] + p["high"]) / 2
        if self.kind in ("normal", "exponential", "gamma"):
            return float(p["mean"])
        if self.kind == "lognormal":
            mu, sigma = lognormal_params(p)
            return math.exp(mu + sigma**2 / 2)
        return float(np.mean(p["values"]))


def lognormal_params(p: dict) -> tuple[float, float]:
    if "mu" in p:
        return float(p["mu"]), float(p["sigma"])
    mean, median = float(p["mean"]), float(p["median"])
    if not mean >= median > 0:
        raise ValueError(f"lognormal needs mean >= median > 0, got mean={mean} median={median}")
    return math.log(median), math.sqrt(2 * math.log(mean / median))


def parse_dist(value, where: str, integer: bool = False, positive: bool = True) -> Dist:
    """A constant number or {dist: ..., ...}; `where` names the scenario key in error messages."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: must be a number or a distribution mapping")
    if isinstance(value, (int, float)):
        if positive and value < 0:
            raise ValueError(f"{where}: must be >= 0, got {value}")
        return Dist("constant", {"value": float(value)}, integer=integer)
    if not isinstance(value, dict) or "dist" not in value:
        raise ValueError(f"{where}: must be a number or a mapping with a 'dist' key")
    kind = value["dist"]
    if kind not in PARAMS:
        raise ValueError(f"{where}.dist: unknown distribution {kind!r} (known: {', '.join(sorted(PARAMS))})")
    params = {k: v for k, v in value.items() if k != "dist" and k not in BOUNDS}
    for k in params:
        if k not in PARAMS[kind]:
            raise ValueError(
                f"{where}.{k}: unknown key for dist {kind!r} "
                f"(allowed: {', '.join(sorted(PARAMS[kind] | BOUNDS))})"
            )
    required = {"lognormal": None}.get(kind, PARAMS[kind])
    if kind == "lognormal":
        if not ({"mean", "median"} <= params.keys() or {"mu", "sigma"} <= params.keys()):
            raise ValueError(f"{where}: lognormal needs mean and median, or mu and sigma")
    else:
        for k in required:
            if k not in params:
                raise ValueError(f"{where}.{k}: required for dist {kind!r}")
    for k, v in params.items():
        if k == "values":
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{where}.values: must be a non-empty list of numbers")
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}.{k}: must be a finite number, got {v!r}")
        if k in ("std", "cv", "sigma", "mean", "median") and v <= 0 and kind != "normal":
            raise ValueError(f"{where}.{k}: must be > 0, got {v}")
    if kind == "uniform" and params["high"] < params["low"]:
        raise ValueError(f"{where}: high must be >= low")
    if kind == "lognormal" and "mean" in params:
        lognormal_params(params)
    lo, hi = value.get("min"), value.get("max")
    for k, v in (("min", lo), ("max", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{where}.{k}: must be a number")
    if lo is None and positive:
        lo = 1.0 if integer else 0.0
    return Dist(kind, params, lo, hi, bool(value.get("integer", integer)))
