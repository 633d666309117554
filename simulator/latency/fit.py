"""Robust fit of LatencyModel to profile rows, hold-out splits and error metrics.

The fit minimises a soft-L1 (Huber-like) loss of log(predicted / measured) with scipy's bounded
least squares: log residuals weigh every row by its relative error (what MAPE measures) and the
robust loss caps the pull of outliers (a 3x straggler costs about as much as a 10% miss).

Which law it fits is chosen by extrapolating inside the training rows (choose_law): past the weights'
floor a decode step's linears rise either along the roofline through the origin (decode tokens priced
like prefill tokens) or from the floor in a straight line with an intercept (decode tokens out of the
roofline, the rise carried by the per-sequence and hinge terms, as small-row CPU GEMMs behave). A
profile with two batches above the floor cannot tell them apart, and they extrapolate differently.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simulator.latency.model import COEFFS, HINGES, LatencyModel, coeffs_array
from simulator.latency.profile import Profile
from simulator.latency.where import evaluate_where

LOSS_SCALE = 0.03  # relative error where the loss turns from quadratic to linear
BOOSTED = ("overhead_ms", "prefill_token_ms")  # each gets a second start, ten times larger (see fit)
ROOF_P = 8.0  # a near-sharp roofline knee; a fitted one trades off against the attention term
HINGE_KNOTS = 3
TIE = 1e-3  # validation errors (mean |log(pred/measured)|) this close are a tie: the full law is kept


def _knots(values: np.ndarray, count: int) -> list[float]:
    """Knots spread evenly in log scale strictly inside the range of the positive values."""
    v = values[values > 0]
    if len(v) == 0 or v.max() < 4 * v.min():
        return []
    lo, hi = np.log(v.min()), np.log(v.max())
    return [float(np.exp(lo + (hi - lo) * j / (count + 1))) for j in range(1, count + 1)]


def _median_per_shape(shape: dict[str, np.ndarray], y: np.ndarray):
    """Repeated measurements of one step shape -> their median (robust to stragglers; each shape
    then weighs once however often it was repeated)."""
    names = sorted(shape)
    uniq, inv = np.unique(np.stack([shape[k] for k in names], axis=1), axis=0, return_inverse=True)
    inv = inv.ravel()
    med = np.array([np.median(y[inv == g]) for g in range(len(uniq))])
    return {k: uniq[:, i] for i, k in enumerate(names)}, med


class _Layout:
    """Maps the optimiser's vector (parameters of order one, all >= 0) to model parameters."""

    def __init__(self, shape: dict[str, np.ndarray], y: np.ndarray, decode_roofline: bool = True):
        from simulator.latency.model import prefill_attention_work

        typical = float(np.median(y))

        def unit(v: np.ndarray) -> float:
            v = v[v > 0]
            return typical / float(np.median(v)) if len(v) else typical

        attn = prefill_attention_work(shape["prefill_tokens"], shape["prefill_context"],
                                      shape["prefill_seqs"])
        units = {"prefill_seq_ms": unit(shape["prefill_seqs"]), "decode_seq_ms": unit(shape["decode_seqs"]),
                 "prefill_token_ms": unit(shape["prefill_tokens"]), "decode_token_ms": 1.0,
                 "prefill_attn_ms": unit(attn), "decode_kv_ms": unit(shape["decode_context"])}
        self.scale = np.array([units.get(k, typical) for k in COEFFS])
        self.knots = {"prefill_knots": _knots(shape["prefill_tokens"], HINGE_KNOTS),
                      "decode_knots": _knots(shape["decode_seqs"], HINGE_KNOTS)}
        self.hinge_scale = {"prefill_knots": unit(shape["prefill_tokens"]),
                            "decode_knots": unit(shape["decode_seqs"])}
        self.kv_scale = units["decode_kv_ms"]
        self.size = len(COEFFS) + sum(len(k) for k in self.knots.values()) + len(self.knots["decode_knots"])
        # start every term small; a term the data cannot see (no prefill rows, say) starts and stays at 0
        has_p, has_d = bool((shape["prefill_tokens"] > 0).any()), bool((shape["decode_seqs"] > 0).any())
        seen = {"prefill": has_p, "decode": has_d, "overhead": True, "gemm": True}
        self.start = np.array([0.02 * seen[k.split("_")[0]] for k in COEFFS]
                              + [0.02 * has_p] * len(self.knots["prefill_knots"])
                              + [0.02 * has_d] * 2 * len(self.knots["decode_knots"]))
        if not (attn > 0).any():
            self.start[COEFFS.index("prefill_attn_ms")] = 0.0
        if not decode_roofline:  # decodes share the floor; their rise is per-sequence and hinge terms
            self.start[COEFFS.index("decode_token_ms")] = 0.0

    def params(self, x: np.ndarray) -> dict:
        q = dict(zip(COEFFS, (x[: len(COEFFS)] * self.scale).tolist()))
        # a decode token goes through the same linear layers as a prefill token: it costs a
        # fraction (x in [0, 1]) of one, so the decode roofline cannot outrun the prefill one
        q["decode_token_ms"] = q["prefill_token_ms"] * min(float(x[COEFFS.index("decode_token_ms")]), 1.0)
        q["roof_p"] = ROOF_P
        i = len(COEFFS)
        for knots, slopes in HINGES:
            ks = self.knots[knots]
            q[knots], q[slopes] = ks, (x[i: i + len(ks)] * self.hinge_scale[knots]).tolist()
            i += len(ks)
        q["decode_kv_ramp_ms"] = (x[i:] * self.kv_scale).tolist()
        return q

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.zeros(self.size), np.full(self.size, np.inf)
        lo[COEFFS.index("overhead_ms")] = 1e-6  # keeps every prediction positive (log residuals)
        hi[COEFFS.index("decode_token_ms")] = 1.0
        return lo, hi


def fit(profile: Profile, match_mean: bool = False) -> LatencyModel:
    """Fit one model to the rows of a single (device, model, dtype, tp) group."""
    groups = profile.groups()
    if len(groups) != 1:
        raise ValueError(f"{profile.source}: rows of {len(groups)} (device, model, dtype, tp) groups "
                         f"{groups[:4]}; select one (e.g. --select \"tp == 4\")")
    shape, y = _median_per_shape(profile.step_shape(), profile.num["latency_ms"])
    if len(y) < _Layout(shape, y).size // 2:
        raise ValueError(f"{profile.source}: {len(y)} distinct step shapes is too few to fit the model")
    key = groups[0]
    decode_roofline = choose_law(shape, y)
    params = _solve(shape, y, decode_roofline)
    fit_range = {
        "phases": sorted(set(profile.text["phase"])),
        "max_batch_size": int(profile.num["batch_size"].max()),
        "max_num_tokens": int(profile.num["num_tokens"].max()),
        "max_context_tokens": int(profile.num["context_tokens"].max()),
    }
    if match_mean:
        params = scale_params(params, mean_scale(LatencyModel(*key, params), profile))
    # which law choose_law kept, so a reader of the model (or of calibrate's output) can tell
    law = "roofline" if decode_roofline else "floor + per-sequence"
    return LatencyModel(*key, params, provenance={"decode_law": law}, fit_range=fit_range)


def _solve(shape: dict[str, np.ndarray], y: np.ndarray, decode_roofline: bool = True) -> dict:
    """The law's parameters for the rows, by the robust least squares of the module docstring."""
    layout = _Layout(shape, y, decode_roofline)
    log_y = np.log(y)
    active = layout.start > 0  # terms the data cannot see stay at 0 (a zero Jacobian column misleads trf)

    def full(x: np.ndarray) -> np.ndarray:
        v = np.zeros(layout.size)
        v[active] = x
        return v

    def residuals(x: np.ndarray) -> np.ndarray:
        a, b = coeffs_array(layout.params(full(x)), shape["prefill_tokens"], shape["prefill_context"],
                            shape["decode_seqs"], shape["prefill_seqs"])
        return np.log(np.maximum(a + b * shape["decode_context"], 1e-9)) - log_y

    lo, hi = (v[active] for v in layout.bounds())
    # every term small, so the terms the data needs grow from there; and the same start with the fixed
    # overhead, then the per-token cost, ten times larger, keeping the lowest loss. The loss has two
    # basins: a step's fixed time carried by the overhead or by the GEMM floor. Exact rows of
    # a100-opt-13b-tp1 and a100-llama2-70b-tp4 fitted from the small start alone stopped in the wrong one
    # (8.7% and 8.1% worst error); either boosted start reaches the law itself.
    starts = [layout.start]
    for term in BOOSTED:
        if active[COEFFS.index(term)]:
            boosted = layout.start.copy()
            boosted[COEFFS.index(term)] *= 10
            starts.append(boosted)
    best = min((least_squares(residuals, np.clip(x0[active], lo, hi), bounds=(lo, hi), loss="soft_l1",
                              f_scale=LOSS_SCALE, x_scale="jac", max_nfev=4000) for x0 in starts),
               key=lambda r: r.cost)
    return layout.params(full(best.x))


def choose_law(shape: dict[str, np.ndarray], y: np.ndarray) -> bool:
    """Whether decode tokens enter the roofline (True: the full law) or not (their rise past the floor
    then comes from the per-sequence and hinge terms alone).

    Both are fitted to the step shapes whose decode batch is at most half the largest one and scored
    on the rest (the largest batches), as the rows beyond the profile will be scored; the hinges-only
    law is kept only if it predicts them better by more than TIE. Where there is no such split (no
    decodes, fewer than three smaller batches) the full law is kept."""
    d = shape["decode_seqs"]
    held = d > (d.max() / 2 if len(d) else 0)
    train = {k: v[~held] for k, v in shape.items()}
    smaller = np.unique(train["decode_seqs"][train["decode_seqs"] > 0])
    if not held.any() or len(smaller) < 3 or (~held).sum() < _Layout(train, y[~held]).size // 2:
        return True
    test = {k: v[held] for k, v in shape.items()}

    def error(decode_roofline: bool) -> float:
        a, b = coeffs_array(_solve(train, y[~held], decode_roofline), test["prefill_tokens"],
                            test["prefill_context"], test["decode_seqs"], test["prefill_seqs"])
        return float(np.mean(np.abs(np.log(np.maximum(a + b * test["decode_context"], 1e-9) / y[held]))))

    return error(False) >= error(True) - TIE


def mean_scale(model: LatencyModel, profile: Profile) -> float:
    """Measured over predicted total step time of the rows.

    The robust fit follows the typical step; a run of many steps adds up their mean, which noise
    (stragglers, cold caches) pushes above the typical one. Scaling every coefficient by this factor
    makes the model's total equal the measured total, so a simulated run keeps the engine's pace."""
    predicted = float(np.sum(model.predict_profile(profile)))
    return float(np.sum(profile.num["latency_ms"])) / predicted if predicted > 0 else 1.0


def scale_params(params: dict, factor: float) -> dict:
    """Every millisecond coefficient times factor (the step time is linear in them)."""
    out = dict(params)
    for k, v in params.items():
        if k.endswith("_ms"):
            out[k] = [x * factor for x in v] if isinstance(v, list) else v * factor
    return out


# --- errors -------------------------------------------------------------------------------------

def errors(model: LatencyModel, profile: Profile) -> dict[str, dict[str, float]]:
    """Per phase (and 'all'): rows, MAPE and p90 of the absolute percentage error."""
    ape = 100.0 * np.abs(model.predict_profile(profile) / profile.num["latency_ms"] - 1.0)
    return ape_table(ape, profile.phase)


def ape_table(ape: np.ndarray, phase: np.ndarray) -> dict[str, dict[str, float]]:
    out = {}
    for name in [*sorted(set(phase.tolist())), "all"]:
        sel = ape if name == "all" else ape[phase == name]
        if len(sel):
            out[name] = {"rows": int(len(sel)), "mape": float(np.mean(sel)),
                         "p90_ape": float(np.percentile(sel, 90))}
    return out


def format_errors(table: dict[str, dict[str, float]]) -> str:
    lines = [f"{'phase':<8} {'rows':>5} {'MAPE %':>8} {'p90 APE %':>10}"]
    for name, e in table.items():
        lines.append(f"{name:<8} {e['rows']:>5} {e['mape']:>8.2f} {e['p90_ape']:>10.2f}")
    return "\n".join(lines)


# --- splits -------------------------------------------------------------------------------------

def holdout_mask(profile: Profile, where: str | None = None, frac: float = 0.2, seed: int = 0) -> np.ndarray:
    """True for held-out rows: those matching `where`, else a random `frac` of the rows per phase."""
    if where:
        return evaluate_where(where, profile)
    if not 0 <= frac < 1:
        raise ValueError(f"--holdout-frac must be in [0, 1), got {frac}")
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(profile), dtype=bool)
    phase = profile.phase
    for name in sorted(set(phase.tolist())):  # stratified, so every phase is tested
        idx = np.flatnonzero(phase == name)
        k = int(round(frac * len(idx)))
        mask[rng.choice(idx, size=k, replace=False)] = True
    return mask


def calibrate(profile: Profile, where: str | None = None, frac: float = 0.2, seed: int = 0,
              refit_all: bool = False, match_mean: bool = False) -> tuple[LatencyModel, dict, np.ndarray]:
    """Fit on the training rows, measure the held-out rows; returns (model, errors, holdout mask).

    With refit_all the returned model is refitted on every row (its provenance keeps the held-out
    error of the split fit, which is the honest estimate for it)."""
    mask = holdout_mask(profile, where, frac, seed)
    train, test = profile.subset(~mask), profile.subset(mask)
    if len(train) == 0:
        raise ValueError("the hold-out selects every row: nothing left to train on")
    model = fit(train, match_mean)
    heldout = errors(model, test) if len(test) else {}
    train_err = errors(model, train)
    if refit_all and len(test):
        model = fit(profile, match_mean)
    n_train = int((~mask).sum())
    model.provenance |= provenance(profile, where, frac, seed, n_train, heldout, train_err, refit_all)
    if match_mean:
        model.provenance["match_mean"] = True
    return model, heldout, mask


def provenance(profile: Profile, where, frac, seed, n_train, heldout, train_err, refit_all) -> dict:
    src = Path(profile.source)
    prov = {
        "source": src.name,
        "fit_date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows": len(profile),
        "train_rows": n_train if not refit_all else len(profile),
        "holdout": {"where": where} if where else {"frac": frac, "seed": seed},
        "refit_on_all_rows": bool(refit_all),
        "heldout_error_pct": heldout,
        "train_error_pct": train_err,
        "fitter": "scipy.optimize.least_squares, soft_l1 on log(pred/measured), "
                  f"f_scale={LOSS_SCALE}, coefficients >= 0",
    }
    if src.is_file():
        prov["source_sha256"] = hashlib.sha256(src.read_bytes()).hexdigest()
    return prov
