"""Black-box calibration: engine-step rows from a probe load's streamed token times, then the fit.

A probe is either one request sent to an idle server (its TTFT is the front end's latency plus one
prefill step; its later tokens are decode steps of one sequence) or a batch of streams started
together that decode in lockstep once every prompt is in, into which single requests ("newcomers",
one output token) are injected: the gap in the batch's streams that ends with a newcomer's first
token is one mixed step, its prefill plus the batch's decodes. Gaps between chunks of one stream come
through the same path, so the front end's latency cancels in them; it is estimated last, as the idle
TTFT less the fitted prefill step, and the idle prefill rows then join the fit.

Times are the client's clock in seconds; no I/O here (controlplane.calibrate_probe sends the load).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.core.profile_csv import MIXED_COLUMNS, PROFILE_COLUMNS
from simulator.latency.fit import calibrate, fit
from simulator.latency.model import LatencyModel
from simulator.latency.profile import Profile, parse_rows

SEGMENT = 8  # decode steps whose pace makes one row
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


def _mixed_ms(ends: np.ndarray, tokens: np.ndarray, mixed: set[int], j: int, half: int = 6) -> float | None:
    """Step j's time: the decode pace on either side of it (robust slopes of the step end times over
    the lead stream's token count, as a chunk may carry several tokens) plus the jump of the end
    times at j (median offsets after less before), so no single late chunk decides it."""
    lo = max([k for k in mixed if k < j] + [max(0, j - half - 1)])
    hi = min([k - 1 for k in mixed if k > j] + [min(len(ends) - 1, j + half)])
    before, after = np.arange(lo, j), np.arange(j, hi + 1)
    if len(before) < 3 or len(after) < 3:
        return None
    pace = float(np.median([_slope(tokens[before], ends[before]), _slope(tokens[after], ends[after])]))
    jump = np.median(ends[after] - pace * tokens[after]) - np.median(ends[before] - pace * tokens[before])
    return 1000 * (pace + jump)


def batch_rows(probe: Probe) -> list[dict]:
    """Decode rows (segments of lockstep steps) and mixed rows (the steps newcomers joined)."""
    ends, counts = _lockstep(probe.streams)
    if len(ends) < 2:
        return []
    prompts = np.array([s.prompt_tokens for s in probe.streams])[:, None]
    ctx = (prompts + counts - 1).sum(axis=0)  # KV after each step, summed over the batch
    b = len(probe.streams)
    gaps = np.diff(ends)
    typical = float(np.median(gaps))
    mixed: dict[int, int] = {}  # step index -> newcomer's prompt tokens
    for nc in probe.newcomers:
        if not nc.times:
            continue
        j = int(np.argmin(np.abs(ends - nc.times[0])))
        if j >= 1 and abs(ends[j] - nc.times[0]) <= ALIGN * typical:
            mixed[j] = nc.prompt_tokens
    rows = []
    lead = counts[0].astype(float)
    for j, p in mixed.items():
        ms = _mixed_ms(ends, lead, set(mixed), j)
        if ms is not None:
            rows.append(_row("mixed", p, p, 1, b, ctx[j], ms, "batch"))
    segments: list[list[int]] = []  # runs of decode-only steps, cut into SEGMENT-step pieces
    for j in range(1, len(ends)):
        if j in mixed:
            continue
        if not segments or j != segments[-1][-1] + 1 or len(segments[-1]) == SEGMENT:
            segments.append([])
        segments[-1].append(j)
    for seg in segments:
        points = np.arange(seg[0] - 1, seg[-1] + 1)
        tokens = lead[points]
        if len(points) >= 3 and tokens[-1] > tokens[0]:
            ms = 1000 * _slope(tokens, ends[points])
            rows.append(_row("decode", 0, 0, 0, b, float(np.mean(ctx[seg])), ms, "batch"))
    return rows


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
            ms = 1000 * _slope(np.cumsum(s.counts).astype(float), np.asarray(s.times))
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
    # a step whose estimate is not positive was lost in the client's or the server's jitter
    rows = [r for r in rows if np.isfinite(r["latency_ms"]) and r["latency_ms"] > 0]
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
    model.provenance["frontend_ms"] = frontend
    model.provenance["frontend_ms_per_prompt_token"] = per_token
    return ProbeFit(model, heldout, rows, frontend, per_token)
