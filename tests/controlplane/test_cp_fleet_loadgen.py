"""The built-in load generator: the schedule's arrivals, routing, and what it records per request
(against small in-process OpenAI-style streaming servers)."""

import asyncio
import json
import threading

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from controlplane.loadgen import LoadGenerator, LoadSpec, RequestRecord, summarize
from engine.server import BackgroundServer


def test_arrivals_follow_the_schedule():
    spec = LoadSpec.parse({"arrivals": {"piecewise": [[0, 20], [50, 20], [50, 0], [100, 0]]},
                           "output_tokens": 8})
    times = np.array([t for t, _, _ in spec.arrivals()])
    assert spec.duration == 100
    # Poisson: 1000 expected in the first 50 s (sd ~32), none where the rate is 0
    assert 850 < len(times) < 1150 and times.max() < 50.5
    assert spec.arrivals() == spec.arrivals()  # the seed fixes the draw
    assert spec.rate(25) == 20 and spec.rate(75) == 0 and spec.rate(500) == 0


def test_ramp_and_lengths():
    spec = LoadSpec.parse({"arrivals": {"piecewise": [[0, 0], [100, 20]]}, "seed": 4,
                           "prompt_tokens": {"dist": "uniform", "low": 10, "high": 20}, "output_tokens": 5})
    arr = spec.arrivals()
    times = np.array([a[0] for a in arr])
    assert 850 < len(arr) < 1150  # integral of the ramp: 1000
    assert (times > 50).sum() > 2.5 * (times < 50).sum()  # three quarters of them in the second half
    assert all(10 <= p <= 20 and o == 5 for _, p, o in arr)
    constant = LoadSpec.parse({"arrivals": {"rate": 3}, "duration": 7})
    assert constant.rate(0) == constant.rate(100) == 3 and constant.duration == 7


def test_least_outstanding_and_round_robin_picks():
    urls = ["http://a", "http://b", "http://c"]
    gen = LoadGenerator(LoadSpec.parse({"arrivals": {"rate": 1}, "duration": 1}), lambda: urls)
    gen.outstanding = {"http://a": 2, "http://b": 0, "http://c": 1}
    assert {gen._pick() for _ in range(6)} == {"http://b"}
    gen.outstanding["http://b"] = 5
    assert gen._pick() == "http://c"
    spec = LoadSpec.parse({"arrivals": {"rate": 1}, "duration": 1, "routing": "round_robin"})
    rr = LoadGenerator(spec, lambda: urls)
    rr.outstanding = {"http://a": 9}
    assert [rr._pick() for _ in range(4)] == urls + urls[:1]
    assert LoadGenerator(LoadSpec.parse({"arrivals": {"rate": 1}, "duration": 1}), lambda: [])._pick() is None


def test_summary_percentiles_and_statuses():
    recs = [RequestRecord(i, "u", 10, 5, 200, ttft=0.1 * (i + 1), e2e=1.0 + i, tokens=5) for i in range(10)]
    recs += [RequestRecord(10, "u", 10, 5, 429), RequestRecord(11, "u", 10, 5, "error")]
    s = summarize(recs, duration=6.0)
    assert s["requests"] == 12 and s["ok"] == 10 and s["by_status"] == {"200": 10, "429": 1, "error": 1}
    assert s["rate_rps"] == 2.0 and s["output_tokens"] == 50
    assert s["ttft_s"]["p50"] == pytest.approx(0.55) and s["e2e_s"]["p90"] == pytest.approx(9.1)


def streaming_app(token_delay: float) -> FastAPI:
    """Streams max_tokens chunks in the engine's SSE shape; 400 above 100 tokens."""
    app = FastAPI()
    seen: list[dict] = []
    app.state.seen = seen

    @app.post("/v1/completions")
    async def completions(req: Request):
        body = await req.json()
        seen.append(body)
        n = body["max_tokens"]
        if n > 100:
            return JSONResponse({"error": {"message": "max_tokens too large", "code": 400}}, 400)

        async def chunks():
            for _ in range(n):
                await asyncio.sleep(token_delay)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': 'x'}]})}\n\n"
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")
    return app


def test_requests_against_streaming_servers():
    app = streaming_app(0.01)
    with BackgroundServer(app) as one, BackgroundServer(app) as two:
        spec = LoadSpec.parse({"arrivals": {"rate": 20}, "duration": 2, "prompt_tokens": 12,
                               "routing": "round_robin",
                               "output_tokens": {"dist": "uniform", "low": 5, "high": 120}})
        gen = LoadGenerator(spec, lambda: [one.url, two.url, "http://127.0.0.1:9"])  # the third refuses
        result = gen.run()
    recs = result.records
    assert len(recs) == len(spec.arrivals()) > 20
    assert all(len(b["prompt"]) == 12 and b["ignore_eos"] and b["stream"] for b in app.state.seen)
    for r in recs:
        if r.endpoint.endswith(":9"):
            assert r.status == "error" and "ConnectError" in r.error
        elif r.max_tokens > 100:
            assert r.status == 400 and "too large" in r.error
        else:
            assert r.status == 200 and r.tokens == r.max_tokens
            assert 0 < r.ttft < r.e2e and r.e2e >= 0.01 * r.max_tokens
    s = result.summary()
    assert s["ok"] == sum(r.status == 200 for r in recs) > 0 and s["duration_s"] >= 2.0
    assert gen.outstanding == {one.url: 0, two.url: 0, "http://127.0.0.1:9": 0}


def test_stop_ends_the_schedule_early():
    with BackgroundServer(streaming_app(0.001)) as srv:
        spec = LoadSpec.parse({"arrivals": {"rate": 5}, "duration": 60, "output_tokens": 2})
        gen = LoadGenerator(spec, lambda: [srv.url])
        threading.Timer(1.0, gen.stop).start()
        result = gen.run()
    assert result.duration < 2.0 and len(result.records) < 20
