"""Built-in load: OpenAI `/v1/completions` at a rate schedule against a fleet, with arrivals drawn as
the simulator draws them (Poisson by default; a scenario's `arrivals` section is accepted as-is).

    spec = LoadSpec.parse({"arrivals": {"piecewise": [[0, 1], [30, 6], [60, 1]]}, "output_tokens": 64})
    gen = LoadGenerator(spec, fleet.endpoints)   # endpoints: a callable, read again for every request
    result = gen.run()                           # blocks for spec.duration, then for in-flight requests
    result.summary()                             # counts, TTFT/E2E percentiles, achieved rate

`gen.stop()` (from any thread) ends the schedule early; in-flight requests still finish. `gen.records`
grows as requests complete, so a dashboard may read it live. Requests stream (TTFT is the first
chunk), carry `ignore_eos` so the output length is the one drawn, and send random token ids (3..255,
inside every vocabulary the engine accepts) as the prompt, so the prompt length is exact and prefix
caching sees no shared prefix. The client costs about 0.3 ms of CPU per streamed token (httpx).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from autoscaler.schema_parts import COUNT0, POS, mapping
from autoscaler.validation import check
from autoscaler.yamlfile import Document, document
from controlplane.batch_load import BATCH, BatchLoad
from simulator.dists import Dist
from simulator.scenario_schema import ARRIVALS, DIST, dist_at
from simulator.scenario_workload import arrivals_config
from simulator.workload import RateCurve, arrival_times

ROUTINGS = ("least_outstanding", "round_robin")
# a load section mirrors a scenario's workload: the same arrivals (rate, piecewise, diurnal, spikes,
# poisson or gamma) and length distributions, plus how long and where to send them
LOAD = mapping(
    {
        "arrivals": ARRIVALS,
        "duration": POS,
        "prompt_tokens": DIST,
        "output_tokens": DIST,
        "routing": {"enum": list(ROUTINGS)},
        "seed": COUNT0,
        "timeout": POS,
        "batch": BATCH,  # one batch submitted to the router's Batch API (controlplane.batch_load)
    },
    ("arrivals",),
)


def _tokens(n: float) -> Dist:
    return Dist("constant", {"value": n}, integer=True)


@dataclass
class LoadSpec:
    curve: RateCurve  # requests per second over time
    duration: float  # seconds of arrivals
    cv: float = 1.0  # inter-arrival CV: 1 is Poisson
    prompt_tokens: Dist = field(default_factory=lambda: _tokens(256))
    output_tokens: Dist = field(default_factory=lambda: _tokens(64))
    routing: str = "least_outstanding"
    seed: int = 0
    timeout: float = 120.0  # seconds per request
    batch: BatchLoad | None = None  # a batch submitted at batch.at (needs the fleet's router)

    @classmethod
    def parse(cls, source: dict | Document) -> LoadSpec:
        """From a `load:` mapping (or its Document, for errors naming file, line and field):

            arrivals: {piecewise: [[0, 1], [60, 8], [120, 1]]}   # as in a scenario's workload
            duration: 120             # default: the last piecewise point's time (required otherwise)
            prompt_tokens: 256        # a number or a distribution, as in a scenario
            output_tokens: {dist: lognormal, mean: 150, median: 120, max: 512}
            routing: least_outstanding   # or round_robin
            seed: 0
            timeout: 120              # seconds per request
            batch: {at: 20, lines: 3000, completion_window: 4m}   # controlplane.batch_load
        """
        doc = document(source)
        check(LOAD, doc)
        d = doc.data
        a = arrivals_config(doc.at("arrivals"))
        curve = RateCurve(**a["curve"], spikes=a["spikes"])
        if "duration" in d:
            duration = float(d["duration"])
        elif curve.kind == "piecewise" and curve.points[-1][0] > 0:
            duration = curve.points[-1][0]
        else:
            raise doc.error(("duration",), "is required unless the last piecewise point gives it")
        spec = cls(curve, duration, a["cv"])
        for k in ("prompt_tokens", "output_tokens"):
            if k in d:
                dist = dist_at(doc, k, integer=True)
                setattr(spec, k, Dist(dist.kind, dist.params, max(dist.lo or 1, 1), dist.hi, True))
        for k, kind in (("routing", str), ("seed", int), ("timeout", float)):
            if k in d:
                setattr(spec, k, kind(d[k]))
        if "batch" in d:
            spec.batch = BatchLoad.parse(doc.at("batch"))
        return spec

    def rate(self, t: float) -> float:
        """The scheduled rate at t seconds (the last point's rate after it)."""
        return float(self.curve(np.array([t]))[0])

    def arrivals(self) -> list[tuple[float, int, int]]:
        """(send time in seconds, prompt tokens, output tokens), drawn from the seed."""
        rng = np.random.default_rng(self.seed)
        times = arrival_times(self.curve, self.duration, self.cv, rng)
        prompt = self.prompt_tokens.sample(rng, len(times)).astype(int)
        output = self.output_tokens.sample(rng, len(times)).astype(int)
        return [(float(t), int(p), int(o)) for t, p, o in zip(times, prompt, output)]


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
    """Request counts by status, TTFT/E2E/TPOT percentiles of the successful ones (TPOT: a request's
    time after its first token over its other tokens), the rate sent over `duration` seconds."""
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
        "tpot_s": _percentiles([(r.e2e - r.ttft) / (r.tokens - 1) for r in ok
                                if r.e2e is not None and r.ttft is not None and r.tokens > 1]),
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
