"""Black-box calibration: engine-step rows from a probe load's streamed token times, then the fit.

A probe is either one request sent to an idle server (its TTFT is the front end's latency plus one
prefill step; its later tokens are decode steps of one sequence) or a batch of streams started
together that decode in lockstep once every prompt is in, into which single requests ("newcomers",
one output token) are injected: the gap in the batch's streams that ends with a newcomer's first
token is one mixed step, its prefill plus the batch's decodes. A batch's chunk times are fitted as
one curve over the tokens streamed, with a jump at each join (the decode pace and each mixed step
from every point, not from single gaps: a server may merge tokens into one chunk, and a stalled
front end or client delivers several steps at once). Gaps between chunks of one stream come through
the same path, so the front end's latency cancels in them; it is estimated last, as the idle TTFT
less the fitted prefill step, and the idle prefill rows then join the fit. The idle requests' delays
are kept as quantiles too (simulator.frontend): a pool may draw each request's front end from them.

Times are the client's clock in seconds; no I/O here (controlplane.calibrate_probe sends the load).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from engine.core.profile_csv import MIXED_COLUMNS, PROFILE_COLUMNS
from simulator.frontend import delay_quantiles
from simulator.latency.fit import calibrate, fit
from simulator.latency.model import LatencyModel
from simulator.latency.profile import Profile, parse_rows

FLOOR = 0.5  # of the median single-sequence decode step: the fastest believable step
MIN_POINTS = 5  # lockstep points a probe needs beyond one for each join
ALIGN = 0.35  # a chunk belongs to a step when within this fraction of a step of the step's end
COLUMNS = list(PROFILE_COLUMNS) + list(MIXED_COLUMNS) + ["probe"]


@dataclass
class Stream:
    """One streamed request as the client saw it."""

    prompt_tokens: int
    sent: float
    times: list[float] = field(default_factory=list)  # arrival of each chunk that carried tokens
    counts: list[int] = field(default_factory=list)  # tokens in each such chunk

    @property
    def ttft(self) -> float:
        return self.times[0] - self.sent


@dataclass
class Probe:
    kind: str  # "idle" or "batch"
    streams: list[Stream]
    newcomers: list[Stream] = field(default_factory=list)


def _row(phase: str, pt: int, pc: int, ps: int, ds: int, dc: float, ms: float, probe: str) -> dict:
    n = pt + ds
    return {"phase": phase, "batch_size": ps + ds, "num_tokens": n, "context_tokens": int(round(pc + dc)),
            "prefill_tokens": pt, "decode_seqs": ds, "prefill_context": pc, "prefill_seqs": ps,
            "decode_context": int(round(dc)), "latency_ms": ms, "probe": probe}


def _lockstep(streams: list[Stream]) -> tuple[np.ndarray, np.ndarray]:
    """Step end times once every stream decodes (median over streams of the chunk nearest each of the
    first stream's chunks) and each stream's token count at each of them."""
    start = max(s.times[0] for s in streams)
    end = min(s.times[-1] for s in streams)
    ref = np.asarray(streams[0].times)
    anchors = ref[(ref >= start) & (ref <= end)]
    if len(anchors) < 2:
        return np.empty(0), np.empty((len(streams), 0))
    matched, counts = [], []
    for s in streams:
        t, cum = np.asarray(s.times), np.cumsum(s.counts)
        idx = np.clip(np.searchsorted(t, anchors), 1, len(t) - 1)
        nearest = np.where(np.abs(t[idx - 1] - anchors) <= np.abs(t[idx] - anchors), idx - 1, idx)
        matched.append(t[nearest])
        counts.append(cum[nearest])
    return np.median(np.array(matched), axis=0), np.array(counts)


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Theil-Sen slope (median of pairwise slopes): a chunk that leaves the server late moves one
    point, which a least-squares line or an end-to-end mean would follow."""
    i, j = np.triu_indices(len(x), 1)
    ok = x[j] != x[i]
    return float(np.median((y[j] - y[i])[ok] / (x[j] - x[i])[ok])) if ok.any() else float("nan")


def _step_fit(ends: np.ndarray, tokens: np.ndarray, joins: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The lockstep window as a curve with a step at each join: ends ~ a + p tokens + q tokens^2 +
    jump_k after join k (the square: a decode step grows with the KV it reads), fitted by least
    absolute deviations (a median, not a mean: late chunks of a busy server or client pull little),
    every point informing the pace. A chunk may carry several tokens, so the lead stream's token
    count, not the chunk index, is the x axis. Returns the pace at each point and the jumps."""
    idx = np.arange(len(ends))
    t = tokens - tokens[0]
    x = np.column_stack([np.ones(len(ends)), t, t ** 2] + [(idx >= j).astype(float) for j in joins])
    n, k = x.shape
    y = ends - ends[0]  # times of order one step, not seconds since boot
    # min sum(u + v) with x p + u - v = y, u, v >= 0, p free
    cost = np.concatenate([np.zeros(k), np.ones(2 * n)])
    lp = linprog(cost, A_eq=np.hstack([x, np.eye(n), -np.eye(n)]), b_eq=y,
                 bounds=[(None, None)] * k + [(0, None)] * (2 * n), method="highs")
    p = lp.x[:k] if lp.success else np.linalg.lstsq(x, y, rcond=None)[0]
    return p[1] + 2 * p[2] * t, p[3:]


def _window(probe: Probe) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, int]] | None:
    """A batch probe's lockstep window: step end times, the lead stream's token count and the batch's
    KV (summed) at each, and the steps newcomers joined (index -> prompt tokens); None when short."""
    ends, counts = _lockstep(probe.streams)
    if len(ends) < 2:
        return None
    prompts = np.array([s.prompt_tokens for s in probe.streams])[:, None]
    ctx = (prompts + counts - 1).sum(axis=0)  # KV after each step, summed over the batch
    typical = float(np.median(np.diff(ends)))
    mixed: dict[int, int] = {}
    for nc in probe.newcomers:
        if not nc.times:
            continue
        j = int(np.argmin(np.abs(ends - nc.times[0])))
        if j >= 1 and abs(ends[j] - nc.times[0]) <= ALIGN * typical:
            mixed[j] = nc.prompt_tokens
    lead = counts[0].astype(float)
    if len(ends) < len(mixed) + MIN_POINTS or lead[-1] - lead[0] < MIN_POINTS:
        return None
    return ends, lead, ctx, mixed


def batch_rows(probe: Probe) -> list[dict]:
    """One decode row (the pace of the lockstep window) and mixed rows (the steps newcomers joined)."""
    window = _window(probe)
    if window is None:
        return []
    ends, lead, ctx, mixed = window
    b = len(probe.streams)
    joins = sorted(mixed)
    pace, jumps = _step_fit(ends, lead, joins)
    decode = [j for j in range(1, len(ends)) if j not in mixed]
    mid = decode[len(decode) // 2]
    rows = [_row("decode", 0, 0, 0, b, float(ctx[mid]), 1000 * pace[mid], "batch")]
    for j, jump in zip(joins, jumps):
        rows.append(_row("mixed", mixed[j], mixed[j], 1, b, ctx[j], 1000 * (pace[j] + jump), "batch"))
    return rows


def window_scale(model: LatencyModel, probes: list[Probe]) -> float:
    """Measured over predicted time of every lockstep window (its decode steps and joins added up): a
    diagnostic, recorded and not applied. Against vLLM the windows ran 4-16% slower than the rows, but
    scaling the model by it moved the simulated TPOT median 5-15% above the served one (and the mean
    too): the slow time is a few stalls that hit some requests hard, not a slower step for all."""
    measured = predicted = 0.0
    for probe in probes:
        window = _window(probe) if probe.kind == "batch" else None
        if window is None:
            continue
        ends, lead, ctx, mixed = window
        b = len(probe.streams)
        zero = np.zeros(len(ends) - 1)
        decode = model.step_ms_array(zero, zero, zero + b, ctx[1:])
        predicted += float(np.sum(np.diff(lead) * decode))
        for j, p in mixed.items():
            predicted += model.step_ms(p, p, b, int(ctx[j])) - model.step_ms(0, 0, b, int(ctx[j]))
        measured += 1000 * float(ends[-1] - ends[0])
    return measured / predicted if predicted > 0 else 1.0


def idle_rows(probe: Probe) -> tuple[list[dict], list[tuple[int, float]]]:
    """Decode rows of a lone stream, and (prompt tokens, TTFT ms) for its prefill."""
    rows, ttfts = [], []
    for s in probe.streams:
        if not s.times:
            continue
        ttfts.append((s.prompt_tokens, 1000 * s.ttft))
        tokens = int(sum(s.counts[1:]))
        if tokens > 0:
            # the step giving token g + 1 attends over prompt + g; g runs over counts[0] .. total - 1
            g = np.arange(s.counts[0], s.counts[0] + tokens)
            pace, _ = _step_fit(np.asarray(s.times), np.cumsum(s.counts).astype(float), [])
            ms = 1000 * float(np.mean(pace))
            rows.append(_row("decode", 0, 0, 0, 1, s.prompt_tokens + float(g.mean()), ms, "idle"))
    return rows, ttfts


def _profile(rows: list[dict], key: tuple[str, str, str, int], source: str) -> Profile:
    device, model, dtype, tp = key
    text = [{**{c: str(r[c]) for c in COLUMNS[4:]}, "device": device, "model": model, "dtype": dtype,
             "tp": str(tp)} for r in rows]
    return parse_rows(text, COLUMNS, source)


@dataclass
class ProbeFit:
    model: LatencyModel
    heldout: dict
    rows: list[dict]
    frontend_ms: float  # client TTFT at idle less the prefill step: the HTTP path and tokenizer ...
    frontend_ms_per_token: float  # ... plus this much per prompt token


def fit_probes(probes: list[Probe], key: tuple[str, str, str, int], frac: float = 0.2, seed: int = 0,
               source: str = "probe") -> ProbeFit:
    """Rows from every probe; a first fit on in-stream steps; the front end's latency from the idle
    TTFTs; then the final fit (held-out error on a random `frac` of the rows, refitted on all)."""
    rows, ttfts = [], []
    for p in probes:
        if p.kind == "batch":
            rows += batch_rows(p)
        else:
            r, t = idle_rows(p)
            rows += r
            ttfts += t
    rows = [r for r in rows if np.isfinite(r["latency_ms"])]
    # no step is much faster than one sequence's decode step: a row far below it (or not positive)
    # timed a burst of chunks that a stalled client or front end delivered at once, not the engine
    lone = [r["latency_ms"] for r in rows if r["phase"] == "decode" and r["batch_size"] == 1]
    floor = FLOOR * float(np.median(lone)) if lone else 0.0
    rows = [r for r in rows if r["latency_ms"] > max(floor, 0.0)]
    if not rows:
        raise ValueError(f"{source}: the probe load gave no usable steps")
    first = fit(_profile(rows, key, source))
    frontend, per_token = 0.0, 0.0
    if ttfts:
        lengths, ms = np.array(ttfts, dtype=float).T
        extra = ms - first.step_ms_array(lengths, lengths, 0, 0)
        # the request body and its parsing grow with the prompt: a line in its length, slope >= 0
        per_token = max(0.0, _slope(lengths, extra)) if len(set(lengths)) > 2 else 0.0
        frontend = max(0.0, float(np.median(extra - per_token * lengths)))
        for n, t in ttfts:
            step = t - frontend - per_token * n
            if step > 0:
                rows.append(_row("prefill", int(n), int(n), 1, 0, 0, step, "idle"))
    model, heldout, _ = calibrate(_profile(rows, key, source), frac=frac, seed=seed, refit_all=True)
    model.provenance["window_scale"] = window_scale(model, probes)
    model.provenance["frontend_ms"] = frontend
    model.provenance["frontend_ms_per_prompt_token"] = per_token
    if ttfts:  # each idle request's delay beside the final model's prefill step: the spread, not one median
        lengths, ms = np.array(ttfts, dtype=float).T
        delays = ms - model.step_ms_array(lengths, lengths, 0, 0) - per_token * lengths
        model.provenance["frontend_ms_quantiles"] = delay_quantiles(delays)
    return ProbeFit(model, heldout, rows, frontend, per_token)
