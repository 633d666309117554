"""A calibrated step-latency model for one (device, model, dtype, tp).

The step time is a sum of physically shaped, non-negative terms (all coefficients >= 0, so it is
monotone in every input and extrapolates linearly in tokens, sequences and context):

    step_ms = overhead                                    launches, all-reduce latency, sampling
            + prefill_fixed * [any prefill tokens]        the prefill path's extra kernels
            + prefill_seq * prefill_seqs + decode_seq * decode_seqs     per-sequence bookkeeping
            + roof(gemm_floor, prefill_token * prefill_tokens + decode_token * decode_seqs)
            + sum_j prefill_hinge_j * max(0, prefill_tokens - prefill_knot_j)
            + sum_j decode_hinge_j * max(0, decode_seqs - decode_knot_j)
            + prefill_attn * sum_i t_i * (ctx_i - t_i / 2)   causal attention of the prefill chunks
            + (decode_kv + sum_j decode_kv_ramp_j * ramp_j(decode_seqs)) * decode_context
                                                          KV bytes read by the decodes

roof(F, x) = (F^p + x^p)^(1/p) is a smooth roofline for the linear layers: a step streams the
weights once (the floor F) until the tokens' compute x dominates. A mixture-of-experts model
(optional moe_floor_ms, moe_experts E, moe_topk k) streams only the experts its n tokens touch: F =
gemm_floor + moe_floor * (1 - (1 - k/E)^n), moe_floor being the read time of every routed expert and
E (1 - (1 - k/E)^n) the expected number of distinct experts n tokens routed top-k over E pick. The
hinge terms (knots fixed inside the profiled range, slopes >= 0) let the marginal cost of a token or
a sequence grow as the batch outgrows the GPU's sweet spot, as measured; past the last knot every
term is linear, so extrapolation continues the slope seen at the edge of the data. The cost of a KV
token may step up with the batch (ramp_j rises from 0 to 1 between decode_knot_j and twice it), as
when a serving engine switches attention kernels for large batches. The decode context enters only
through the last, linear term, so for a fixed batch the step time is affine in it: step_ms == a + b
* decode_context with (a, b) = decode_coeffs(...), which lets the simulator advance identical decode
steps in closed form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from simulator.latency.fileformat import FORMAT

MODELS_DIR = Path(__file__).resolve().parent / "models"

# coefficient names in a fixed order (the fitter's parameter vector); roof_p is the roofline exponent
COEFFS = (
    "overhead_ms",
    "prefill_fixed_ms",
    "prefill_seq_ms",
    "decode_seq_ms",
    "gemm_floor_ms",
    "prefill_token_ms",
    "decode_token_ms",
    "prefill_attn_ms",
    "decode_kv_ms",
)
PARAMS = COEFFS + ("roof_p",)
HINGES = (("prefill_knots", "prefill_hinge_ms"), ("decode_knots", "decode_hinge_ms"))
MOE = ("moe_floor_ms", "moe_experts", "moe_topk")  # optional: routed experts' weights read per step


def experts_touched(tokens, experts: float, topk: float) -> np.ndarray:
    """Expected fraction of E experts that n tokens, each routed to k distinct ones uniformly, touch:
    1 - (1 - k/E)^n (an expert is missed by one token with probability 1 - k/E)."""
    n = np.asarray(tokens, dtype=float)
    return 1.0 - (1.0 - topk / experts) ** n


def gemm_floor(q: dict, tokens):
    """The weights' read time of a step of `tokens` tokens (MoE: only the experts they touch)."""
    if not q.get("moe_experts"):
        return q["gemm_floor_ms"]
    return q["gemm_floor_ms"] + q["moe_floor_ms"] * experts_touched(tokens, q["moe_experts"], q["moe_topk"])


def hinge(x: np.ndarray, knots: list[float], slopes: list[float]) -> np.ndarray:
    """sum_j slopes_j * max(0, x - knots_j): convex, monotone, linear beyond the last knot."""
    out = np.zeros(np.shape(x))
    for k, h in zip(knots, slopes):
        out = out + h * np.maximum(np.asarray(x, dtype=float) - k, 0.0)
    return out


def ramps(x: np.ndarray, knots: list[float], heights: list[float]) -> np.ndarray:
    """sum_j heights_j * clip((x - knots_j) / knots_j, 0, 1): monotone steps, flat beyond 2 * knot."""
    out = np.zeros(np.shape(x))
    for k, h in zip(knots, heights):
        out = out + h * np.clip((np.asarray(x, dtype=float) - k) / k, 0.0, 1.0)
    return out


def roof(floor: np.ndarray | float, x: np.ndarray | float, p: float) -> np.ndarray:
    """Smooth max of floor and x: (floor^p + x^p)^(1/p), computed without overflow."""
    floor, x = np.asarray(floor, dtype=float), np.asarray(x, dtype=float)
    m = np.maximum(floor, x)
    safe = np.where(m > 0, m, 1.0)
    return np.where(m > 0, safe * ((floor / safe) ** p + (x / safe) ** p) ** (1.0 / p), 0.0)


def prefill_attention_work(prefill_tokens, prefill_context, prefill_seqs) -> np.ndarray:
    """sum over prefilling sequences of t * (ctx - t/2), from the batch totals, sequences taken equal.

    A fresh prompt of t tokens gives t^2/2, a chunk of t tokens on a long KV about t * ctx.
    """
    t = np.asarray(prefill_tokens, dtype=float)
    ctx = np.maximum(np.asarray(prefill_context, dtype=float), t)
    seqs = np.maximum(np.asarray(prefill_seqs, dtype=float), 1.0)
    return t * (ctx - t / 2.0) / seqs


def coeffs_array(q: dict, prefill_tokens, prefill_context, decode_seqs, prefill_seqs=1):
    """(a_ms, b_ms) arrays of the step-time law for parameters q (see the module docstring)."""
    p_tok = np.asarray(prefill_tokens, dtype=float)
    d_seq = np.asarray(decode_seqs, dtype=float)
    p_seq = np.where(p_tok > 0, np.maximum(np.asarray(prefill_seqs, dtype=float), 1.0), 0.0)
    a = (q["overhead_ms"]
         + q["prefill_fixed_ms"] * (p_tok > 0)
         + q["prefill_seq_ms"] * p_seq
         + q["decode_seq_ms"] * d_seq
         + roof(gemm_floor(q, p_tok + d_seq), q["prefill_token_ms"] * p_tok + q["decode_token_ms"] * d_seq,
                q["roof_p"])
         + hinge(p_tok, q["prefill_knots"], q["prefill_hinge_ms"])
         + hinge(d_seq, q["decode_knots"], q["decode_hinge_ms"])
         + q["prefill_attn_ms"] * prefill_attention_work(p_tok, prefill_context, p_seq))
    kv = q["decode_kv_ms"] + ramps(d_seq, q["decode_knots"], q["decode_kv_ramp_ms"])
    b = np.where(d_seq > 0, kv, 0.0)
    return a, np.broadcast_to(b, np.shape(a)).astype(float)


class LatencyModel:
    def __init__(self, device: str, model: str, dtype: str, tp: int, params: dict[str, float],
                 provenance: dict | None = None, fit_range: dict | None = None,
                 engine_settings: dict | None = None):
        missing = [k for k in PARAMS if k not in params]
        if missing:
            raise ValueError(f"latency model {device}/{model}: missing parameter(s) {', '.join(missing)}")
        bad = [k for k in PARAMS if not np.isfinite(params[k]) or params[k] < 0]
        if bad or params["roof_p"] < 1:
            raise ValueError(f"latency model {device}/{model}: parameter(s) {', '.join(bad) or 'roof_p'} "
                             "out of range (coefficients must be >= 0, roof_p >= 1)")
        for knots, slopes in HINGES + (("decode_knots", "decode_kv_ramp_ms"),):
            ks, hs = params.get(knots, []), params.get(slopes, [])
            if len(ks) != len(hs) or any(not np.isfinite(v) or v < 0 for v in [*ks, *hs]):
                raise ValueError(f"latency model {device}/{model}: {knots}/{slopes} must be equally long "
                                 "lists of numbers >= 0")
        self.device, self.model, self.dtype, self.tp = device, model, dtype, int(tp)
        self.params = {k: float(params[k]) for k in PARAMS}
        for knots, slopes in HINGES:
            self.params[knots] = [float(v) for v in params.get(knots, [])]
            self.params[slopes] = [float(v) for v in params.get(slopes, [])]
        self.params["decode_kv_ramp_ms"] = [float(v) for v in params.get("decode_kv_ramp_ms", [])]
        if params.get("moe_experts"):
            moe = {k: float(params.get(k, -1)) for k in MOE}
            if not (moe["moe_floor_ms"] >= 0 and moe["moe_experts"] >= 1
                    and 0 < moe["moe_topk"] <= moe["moe_experts"]):
                raise ValueError(f"latency model {device}/{model}: MoE parameters need moe_floor_ms >= 0, "
                                 f"moe_experts >= 1 and 0 < moe_topk <= moe_experts (got {moe})")
            self.params.update(moe)
        self.provenance = dict(provenance or {})
        self.fit_range = dict(fit_range or {})
        # the measured server's scheduling settings (max_num_seqs, max_num_batched_tokens, block_size,
        # num_kv_blocks, max_model_len, enable_prefix_caching), as far as they were known
        self.engine_settings = dict(engine_settings or {})

    def __repr__(self) -> str:
        return f"LatencyModel({self.device}, {self.model}, {self.dtype}, tp={self.tp})"

    # --- the step-time function -------------------------------------------------------------

    def decode_coeffs_array(self, prefill_tokens, prefill_context, decode_seqs, prefill_seqs=1):
        """Vectorised decode_coeffs: arrays (a_ms, b_ms)."""
        return coeffs_array(self.params, prefill_tokens, prefill_context, decode_seqs, prefill_seqs)

    def decode_coeffs(self, prefill_tokens: int, prefill_context: int, decode_seqs: int,
                      prefill_seqs: int = 1) -> tuple[float, float]:
        """(a_ms, b_ms) with step_ms(prefill_tokens, prefill_context, decode_seqs, ctx) == a + b * ctx."""
        # plain floats: the simulator calls this once per simulated step, numpy would dominate
        q = self.params
        t, d = float(prefill_tokens), float(decode_seqs)
        a = q["overhead_ms"] + q["decode_seq_ms"] * d
        if t > 0:
            seqs = max(float(prefill_seqs), 1.0)
            ctx = max(float(prefill_context), t)
            a += q["prefill_fixed_ms"] + q["prefill_seq_ms"] * seqs
            a += q["prefill_attn_ms"] * t * (ctx - t / 2) / seqs
        floor = q["gemm_floor_ms"]
        if q.get("moe_experts"):
            floor += q["moe_floor_ms"] * (1.0 - (1.0 - q["moe_topk"] / q["moe_experts"]) ** (t + d))
        x, p = q["prefill_token_ms"] * t + q["decode_token_ms"] * d, q["roof_p"]
        m = max(floor, x)
        if m > 0:
            a += m * ((floor / m) ** p + (x / m) ** p) ** (1.0 / p)
        for k, h in zip(q["prefill_knots"], q["prefill_hinge_ms"]):
            a += h * max(t - k, 0.0)
        b = q["decode_kv_ms"] if d > 0 else 0.0
        for k, h, r in zip(q["decode_knots"], q["decode_hinge_ms"], q["decode_kv_ramp_ms"]):
            a += h * max(d - k, 0.0)
            if d > 0:
                b += r * min(max((d - k) / k, 0.0), 1.0)
        return a, b

    def step_ms(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_context: int,
                prefill_seqs: int = 1) -> float:
        """One engine step: prefill_tokens computed for prefill_seqs prefilling sequences whose KV
        lengths after the step sum to prefill_context, plus decode_seqs single-token decodes whose KV
        lengths sum to decode_context."""
        a, b = self.decode_coeffs(prefill_tokens, prefill_context, decode_seqs, prefill_seqs)
        return a + b * float(decode_context)

    def step_ms_array(self, prefill_tokens, prefill_context, decode_seqs, decode_context,
                      prefill_seqs=1) -> np.ndarray:
        a, b = self.decode_coeffs_array(prefill_tokens, prefill_context, decode_seqs, prefill_seqs)
        return a + b * np.asarray(decode_context, dtype=float)

    def predict_ms_array(self, phase, batch_size, num_tokens, context_tokens, **mixed) -> np.ndarray:
        """Vectorised predict_ms over profile-CSV columns (mixed rows may pass the split columns
        prefill_tokens, decode_seqs, prefill_context, prefill_seqs, as in profile.Profile)."""
        from simulator.latency.profile import Profile

        num = {"batch_size": batch_size, "num_tokens": num_tokens, "context_tokens": context_tokens, **mixed}
        n = np.broadcast(np.atleast_1d(phase), *(np.atleast_1d(v) for v in num.values())).size
        phase = np.broadcast_to(np.asarray(phase, dtype=str), (n,))
        num = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy() for k, v in num.items()}
        bad = sorted(set(phase.tolist()) - {"prefill", "decode", "mixed"})
        if bad:
            raise ValueError(f"unknown phase {bad[0]!r} (expected prefill, decode or mixed)")
        shape = Profile(list(num), {"phase": list(phase)}, num).step_shape()
        return self.step_ms_array(shape["prefill_tokens"], shape["prefill_context"], shape["decode_seqs"],
                                  shape["decode_context"], shape["prefill_seqs"])

    def predict_ms(self, phase: str, batch_size: int, num_tokens: int, context_tokens: int,
                   **mixed) -> float:
        """Step time for one profile-CSV row (same meaning as its columns)."""
        return float(self.predict_ms_array([phase], batch_size, num_tokens, context_tokens, **mixed)[0])

    def predict_profile(self, profile) -> np.ndarray:
        """Predictions for every row of a profile.Profile."""
        s = profile.step_shape()
        return self.step_ms_array(s["prefill_tokens"], s["prefill_context"], s["decode_seqs"],
                                  s["decode_context"], s["prefill_seqs"])

    # --- persistence ------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"format": FORMAT, "device": self.device, "model": self.model, "dtype": self.dtype,
                "tp": self.tp, "form": "see simulator/latency/model.py", "params": self.params,
                "fit_range": self.fit_range, "provenance": self.provenance,
                **({"engine_settings": self.engine_settings} if self.engine_settings else {})}

    @classmethod
    def from_dict(cls, d: dict, where: str = "<dict>") -> LatencyModel:
        if d.get("format") != FORMAT:
            raise ValueError(f"{where}: not a slopilot latency model (format {d.get('format')!r}, "
                             f"expected {FORMAT!r})")
        try:
            return cls(d["device"], d["model"], d["dtype"], d["tp"], d["params"], d.get("provenance"),
                       d.get("fit_range"), d.get("engine_settings"))
        except KeyError as exc:
            raise ValueError(f"{where}: missing field {exc.args[0]!r}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LatencyModel:
        """Load a model JSON file; load_latency_model() also takes a shipped model's name."""
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not valid JSON ({exc})") from None
        return cls.from_dict(d, str(p))


def list_named() -> list[str]:
    """Names of the models shipped in simulator/latency/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def is_model_path(name_or_path: str | Path) -> bool:
    """The one naming rule: a path has a '/' or ends in .json; anything else is a shipped model's name."""
    text = str(name_or_path)
    return isinstance(name_or_path, Path) or "/" in text or os.sep in text or text.endswith(".json")


def load_latency_model(name_or_path: str | Path) -> LatencyModel:
    """A latency model from a JSON path or a shipped name (list_named()), by is_model_path's rule."""
    path = Path(name_or_path) if is_model_path(name_or_path) else MODELS_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ValueError(f"latency model {str(name_or_path)!r}: no such file or shipped model "
                         f"(a path has a '/' or ends in .json; shipped: {', '.join(list_named())})")
    return LatencyModel.load(path)
