"""Built-in load: OpenAI `/v1/completions` at a rate schedule (Poisson arrivals) against a fleet.

    spec = LoadSpec.parse({"piecewise": [[0, 1], [30, 6], [60, 1]], "output_tokens": 64})
    gen = LoadGenerator(spec, fleet.endpoints)   # endpoints: a callable, read again for every request
    result = gen.run()                           # blocks for spec.duration, then for in-flight requests
    result.summary()                             # counts, TTFT/E2E percentiles, achieved rate

`gen.stop()` (from any thread) ends the schedule early; in-flight requests still finish. `gen.records`
grows as requests complete, so a dashboard may read it live. Requests stream (TTFT is the first
chunk), carry `ignore_eos` so the output length is the one drawn, and send random token ids as the
prompt so the prompt length is exact and prefix caching sees no shared prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from simulator.dists import Dist, parse_dist
from simulator.workload import RateCurve, arrival_times

ROUTINGS = ("least_outstanding", "round_robin")
KEYS = {"rate", "piecewise", "duration", "prompt_tokens", "output_tokens", "routing", "seed", "timeout"}


@dataclass
class LoadSpec:
    points: list[tuple[float, float]]  # piecewise-linear rate: (seconds since start, requests/s)
    duration: float
    prompt_tokens: Dist = field(default_factory=lambda: Dist("constant", {"value": 256.0}, integer=True))
    output_tokens: Dist = field(default_factory=lambda: Dist("constant", {"value": 64.0}, integer=True))
    routing: str = "least_outstanding"
    seed: int = 0
    timeout: float = 120.0  # seconds per request

    @classmethod
    def parse(cls, d: dict, where: str = "load") -> LoadSpec:
        """From a mapping: `rate: RPS` or `piecewise: [[t, rps], ...]`, plus optional duration (default:
        the last point's time), prompt_tokens/output_tokens (a number or a distribution), routing, seed,
        timeout. Errors name the field, e.g. `load.piecewise[1]: ...`."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: must be a mapping")
        for k in d:
            if k not in KEYS:
                raise ValueError(f"{where}.{k}: unknown key (allowed: {', '.join(sorted(KEYS))})")
        shapes = [k for k in ("rate", "piecewise") if k in d]
        if len(shapes) != 1:
            raise ValueError(f"{where}: give exactly one of rate, piecewise (got {shapes or 'none'})")
        if "rate" in d:
            points = [(0.0, _number(d["rate"], f"{where}.rate"))]
        else:
            points = _points(d["piecewise"], f"{where}.piecewise")
        duration = _number(d["duration"], f"{where}.duration") if "duration" in d else points[-1][0]
        if duration <= 0:
            raise ValueError(f"{where}.duration: must be > 0 (give duration, or a last point after t=0)")
        spec = cls(points, duration)
        for k in ("prompt_tokens", "output_tokens"):
            if k in d:
                dist = parse_dist(d[k], f"{where}.{k}", integer=True)
                setattr(spec, k, Dist(dist.kind, dist.params, max(dist.lo or 1, 1), dist.hi, True))
        if "routing" in d:
            if d["routing"] not in ROUTINGS:
                raise ValueError(f"{where}.routing: must be one of {', '.join(ROUTINGS)}, "
                                 f"got {d['routing']!r}")
            spec.routing = d["routing"]
        if "seed" in d:
            if isinstance(d["seed"], bool) or not isinstance(d["seed"], int):
                raise ValueError(f"{where}.seed: must be an integer, got {d['seed']!r}")
            spec.seed = d["seed"]
        if "timeout" in d:
            spec.timeout = _number(d["timeout"], f"{where}.timeout")
        return spec

    def rate(self, t: float) -> float:
        """The scheduled rate at t seconds (constant after the last point)."""
        return float(self._curve()(np.array([t]))[0])

    def _curve(self) -> RateCurve:
        return RateCurve("piecewise", points=self.points)  # np.interp holds the end values beyond

    def arrivals(self) -> list[tuple[float, int, int]]:
        """(send time in seconds, prompt tokens, output tokens), drawn from the seed."""
        rng = np.random.default_rng(self.seed)
        times = arrival_times(self._curve(), self.duration, 1.0, rng)
        prompt = self.prompt_tokens.sample(rng, len(times)).astype(int)
        output = self.output_tokens.sample(rng, len(times)).astype(int)
        return [(float(t), int(p), int(o)) for t, p, o in zip(times, prompt, output)]


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: must be a number >= 0, got {v!r}")
    return float(v)


def _points(pts, where: str) -> list[tuple[float, float]]:
    if not isinstance(pts, list) or not pts:
        raise ValueError(f"{where}: must be a non-empty list of [time_s, rps] points")
    out: list[tuple[float, float]] = []
    for i, p in enumerate(pts):
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise ValueError(f"{where}[{i}]: must be [time_s, rps], got {p!r}")
        t, r = _number(p[0], f"{where}[{i}][0]"), _number(p[1], f"{where}[{i}][1]")
        if out and t < out[-1][0]:
            raise ValueError(f"{where}[{i}]: times must be non-decreasing ({t} after {out[-1][0]})")
        out.append((t, r))
    return out


@dataclass
class RequestRecord:
    start: float  # seconds since the load began, when the request was sent
    endpoint: str
    prompt_tokens: int
    max_tokens: int
    status: int | str  # the HTTP status, or "error" (connection refused, reset, timeout...)
    ttft: float | None = None  # seconds to the first streamed token
    e2e: float | None = None  # seconds to the end of the stream
    tokens: int = 0  # output tokens received
    error: str = ""


@dataclass
class LoadResult:
    records: list[RequestRecord]
    duration: float  # seconds the schedule ran (spec.duration, or until stop())
    wall: float  # seconds until the last request completed

    def summary(self) -> dict:
        return {**summarize(self.records, self.duration), "wall_s": round(self.wall, 3)}


def _percentiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    p = np.percentile(np.asarray(xs), [50, 90, 99])
    return {"p50": round(float(p[0]), 4), "p90": round(float(p[1]), 4), "p99": round(float(p[2]), 4)}


def summarize(records: Sequence[RequestRecord], duration: float) -> dict:
    """Request counts by status, TTFT/E2E percentiles of the successful ones, the rate sent over
    `duration` seconds."""
    ok = [r for r in records if r.status == 200]
    by_status: dict[str, int] = {}
    for r in records:
        by_status[str(r.status)] = by_status.get(str(r.status), 0) + 1
    return {
        "requests": len(records),
        "ok": len(ok),
        "by_status": by_status,
        "duration_s": round(duration, 3),
        "rate_rps": round(len(records) / duration, 4) if duration > 0 else 0.0,
        "output_tokens": sum(r.tokens for r in ok),
        "ttft_s": _percentiles([r.ttft for r in ok if r.ttft is not None]),
        "e2e_s": _percentiles([r.e2e for r in ok if r.e2e is not None]),
    }


class LoadGenerator:
    """Fires spec's schedule at `endpoints()` (base URLs such as http://127.0.0.1:8000).

    routing: least_outstanding sends each request to the endpoint with the fewest in flight (ties in
    round-robin order); round_robin ignores load. With no endpoint at send time the request is
    recorded with status "no-endpoint".
    """

    def __init__(self, spec: LoadSpec, endpoints: Callable[[], Sequence[str]], *, model: str | None = None,
                 api_key: str | None = None):
        self.spec = spec
        self.endpoints = endpoints
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.records: list[RequestRecord] = []
        self.outstanding: dict[str, int] = {}
        self._rr = itertools.count()
        self._stop = threading.Event()
        self._rng = np.random.default_rng(spec.seed + 1)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> LoadResult:
        return asyncio.run(self.arun())

    async def arun(self) -> LoadResult:
        loop = asyncio.get_running_loop()
        timeout = httpx.Timeout(self.spec.timeout, connect=5.0)
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            t0 = loop.time()
            tasks: set[asyncio.Task] = set()
            for t, prompt, output in [*self.spec.arrivals(), (self.spec.duration, 0, 0)]:
                while not self._stop.is_set() and (delay := t0 + t - loop.time()) > 0:
                    await asyncio.sleep(min(delay, 0.2))  # short naps: stop() is seen quickly
                if self._stop.is_set() or prompt == 0:  # stopped, or the schedule's end
                    break
                task = asyncio.create_task(self._request(client, loop.time() - t0, prompt, output))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            ran = loop.time() - t0
            if tasks:
                await asyncio.gather(*tasks)
            return LoadResult(list(self.records), ran, loop.time() - t0)

    def _pick(self) -> str | None:
        urls = list(self.endpoints())
        if not urls:
            return None
        k = next(self._rr) % len(urls)
        order = urls[k:] + urls[:k]
        if self.spec.routing == "round_robin":
            return order[0]
        return min(order, key=lambda u: self.outstanding.get(u, 0))  # min keeps the first of ties

    async def _request(self, client: httpx.AsyncClient, start: float, prompt: int, output: int) -> None:
        url = self._pick()
        rec = RequestRecord(start, url or "", prompt, output, "no-endpoint")
        if url is None:
            self.records.append(rec)
            return
        body = {"prompt": self._rng.integers(3, 256, prompt).tolist(), "max_tokens": output, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        self.outstanding[url] = self.outstanding.get(url, 0) + 1
        began = time.perf_counter()
        try:
            req = client.stream("POST", f"{url}/v1/completions", json=body, headers=self.headers)
            async with req as resp:
                rec.status = resp.status_code
                if resp.status_code != 200:
                    rec.error = (await resp.aread()).decode(errors="replace")[:200]
                else:
                    await self._read_stream(resp, rec, began)
        except httpx.HTTPError as exc:
            rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self.outstanding[url] -= 1
        rec.e2e = time.perf_counter() - began if rec.status == 200 else None
        self.records.append(rec)

    @staticmethod
    async def _read_stream(resp: httpx.Response, rec: RequestRecord, began: float) -> None:
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:  # the server failed mid-stream
                rec.status, rec.error = "error", str(chunk["error"].get("message", chunk["error"]))[:200]
                return
            if chunk.get("choices"):
                if rec.ttft is None:
                    rec.ttft = time.perf_counter() - began
                rec.tokens += 1
            if chunk.get("usage"):
                rec.tokens = int(chunk["usage"]["completion_tokens"])
