"""The probe load of black-box calibration, sent to any OpenAI-compatible server (vLLM, SGLang, ours).

Three kinds of measurement (simulator.latency.probe_fit turns them into engine-step rows):
single requests at idle over a range of prompt lengths (TTFT: one prefill step), batches of B
streams decoding in lockstep over several batch sizes and context lengths (chunk gaps: decode
steps), and newcomers injected into those batches (the gap they join: a mixed step). Each chunk's
tokens are counted (a server may merge several into one chunk). Prompts are random token ids, new
in every run, so no prefix cache hit shortens a prefill. The server's /metrics page is read
before and after, as a cross-check of what the probe inferred. The plan is walked in an order that
covers the range coarsely first, repeated with other lengths while the time budget lasts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from simulator.latency.probe_fit import Probe, Stream

TOKEN_IDS = (32, 127)  # random prompt ids: printable ASCII in byte-level vocabularies
DECODE_TOKENS = 32  # tokens each batch stream generates
IDLE_TOKENS = 12  # a lone stream's decode pace is a line through this many points
IDLE_REPEAT = 3
NEWCOMERS = 3  # single-step prefills injected into each batch
NEWCOMER_AFTER = 6  # batch tokens seen before the first newcomer is sent (and between newcomers)
# an idle pooled connection is dropped before the server's keep-alive ends (uvicorn's default, vLLM's
# too, is 5 s): reused just as the server closes it, a POST fails with a reset connection
KEEPALIVE_S = 2.0
CACHE_INFO = "vllm:cache_config_info"
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total",
            "vllm:num_preemptions_total", "vllm:iteration_tokens_total_count",
            "vllm:iteration_tokens_total_sum", "vllm:request_queue_time_seconds_sum",
            "vllm:request_queue_time_seconds_count")


@dataclass(frozen=True)
class Spec:
    kind: str  # "idle" or "batch"
    batch: int
    prompt: int
    tokens: int
    newcomers: tuple[int, ...] = ()


def _spread(values: list[int]) -> list[int]:
    """Ends first, then midpoints: any prefix of the order spans the whole range."""
    if len(values) <= 2:
        return list(values)
    out, todo = [values[0], values[-1]], [(0, len(values) - 1)]
    while todo:
        lo, hi = todo.pop(0)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            out.append(values[mid])
            todo += [(lo, mid), (mid, hi)]
    return out


def plan(settings: dict, rng: np.random.Generator, round_: int = 0) -> list[Spec]:
    """One round of probes; later rounds jitter every length so that they add new step shapes."""
    budget = int(settings["max_num_batched_tokens"])
    seqs = int(settings["max_num_seqs"])
    room = int(settings["max_model_len"]) - DECODE_TOKENS - 1
    kv = int(settings.get("kv_tokens") or seqs * room)
    jitter = (lambda n: n) if round_ == 0 else (lambda n: max(8, int(n * rng.uniform(0.7, 1.3))))
    longest = min(budget, room)
    prompts = [int(v) for v in np.unique(np.geomspace(16, longest, 8).astype(int))]
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < seqs] + [seqs]
    # idle requests are short: each length thrice, as one TTFT is at the mercy of a busy machine
    specs = [Spec("idle", 1, n, IDLE_TOKENS) for n in (min(jitter(p), longest) for p in _spread(prompts))
             for _ in range(IDLE_REPEAT)]
    joins = _spread(prompts)
    for i, b in enumerate(_spread(batches)):
        # a long context that the batch can hold and prefill in a few steps
        long = max(16, min(1024, 4 * budget // b, kv // b - DECODE_TOKENS - 16, room))
        for prompt in (min(32, long), long):
            fits = [p for p in joins if p + b <= budget] or [max(1, budget - b)]  # a join is one step
            picks = (fits[(NEWCOMERS * i + k) % len(fits)] for k in range(NEWCOMERS))
            newcomers = tuple(min(jitter(p), budget - b, longest) for p in picks)
            specs.append(Spec("batch", b, min(jitter(prompt), room), DECODE_TOKENS, newcomers))
    return specs


def chunk_tokens(chunk: dict, seen: int) -> int:
    """Tokens one streamed chunk carries. A server that lags behind its engine merges several tokens
    into a chunk (vLLM does), so a chunk is not a step: the count is the chunk's token ids (vLLM's
    `return_token_ids`), else the growth of the running usage (`continuous_usage_stats`, vLLM and
    SGLang), else one a chunk (a server that streams every token alone and knows neither field)."""
    choices = chunk.get("choices") or []
    if not choices:
        return 0  # the final usage chunk
    ids = choices[0].get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    usage = chunk.get("usage") or {}
    if "completion_tokens" in usage:
        return int(usage["completion_tokens"]) - seen
    return 1


async def _stream(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int,
                  on_tokens: Callable[[int], None] | None = None) -> Stream:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0.0, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    s = Stream(prompt_tokens=len(prompt), sent=time.perf_counter())
    seen = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}/v1/completions answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                s.prompt_tokens = int(chunk["usage"]["prompt_tokens"])
            n = chunk_tokens(chunk, seen)
            if n > 0:
                seen += n
                s.times.append(now)
                s.counts.append(n)
                if on_tokens is not None:
                    on_tokens(seen)
    return s


class Prober:
    def __init__(self, url: str, model: str, seed: int = 0):
        self.url, self.model = url.rstrip("/"), model
        self.rng = np.random.default_rng(seed)  # the plan: lengths and their jitter
        # prompt contents differ from run to run: a second calibration of the same server must not
        # find the first one's prompts in its prefix cache
        self.words = np.random.default_rng()

    def _prompt(self, n: int) -> list[int]:
        return [int(t) for t in self.words.integers(*TOKEN_IDS, n)]

    async def run(self, client: httpx.AsyncClient, spec: Spec) -> Probe:
        if spec.kind == "idle":
            return Probe("idle", [await _stream(client, self.url, self.model, self._prompt(spec.prompt),
                                                spec.tokens)])
        started, lead = [0] * spec.batch, [0]  # tokens seen per stream; first stream's count when all are in
        tick = asyncio.Event()

        def on_tokens(i: int) -> Callable[[int], None]:
            def note(k: int) -> None:
                started[i] = k
                if lead[0] == 0 and min(started) > 0:
                    lead[0] = started[0]
                tick.set()
            return note

        tasks = [asyncio.create_task(_stream(client, self.url, self.model, self._prompt(spec.prompt),
                                             spec.tokens, on_tokens(i))) for i in range(spec.batch)]
        newcomers = []
        for k, n in enumerate(spec.newcomers):
            # join the batch once it decodes in lockstep, a few steps apart
            while not tasks[0].done() and not (lead[0] and started[0] >= lead[0] + NEWCOMER_AFTER * (k + 1)):
                tick.clear()
                wake = asyncio.ensure_future(tick.wait())
                await asyncio.wait([wake, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
            if tasks[0].done() or started[0] > spec.tokens - 4:
                break
            newcomers.append(await _stream(client, self.url, self.model, self._prompt(n), 1))
        streams = [await t for t in tasks]
        return Probe("batch", streams, newcomers)


def read_metrics(client: httpx.Client, url: str) -> dict:
    """The counters of COUNTERS (summed over label sets) and the cache-config info labels."""
    try:
        r = client.get(url.rstrip("/") + "/metrics")
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    out: dict = {"info": {}}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == CACHE_INFO:
                out["info"] = dict(s.labels)
            elif s.name in COUNTERS:
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def server_model(client: httpx.Client, url: str) -> tuple[str, int | None]:
    """The served model's name and max_model_len (vLLM and our server list it) from /v1/models."""
    r = client.get(url.rstrip("/") + "/v1/models")
    r.raise_for_status()
    first = r.json()["data"][0]
    return first["id"], first.get("max_model_len")


def probe(url: str, model: str, settings: dict, budget_s: float, seed: int = 0,
          on_probe: Callable[[int, Spec, float], None] | None = None) -> list[Probe]:
    """Walk the plan round after round until budget_s is spent; on_probe(done, spec, elapsed) after each."""
    prober = Prober(url, model, seed)

    async def main() -> list[Probe]:
        out: list[Probe] = []
        start, last = time.monotonic(), 0.0
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024,
                              keepalive_expiry=KEEPALIVE_S)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            round_ = 0
            while True:
                for spec in plan(settings, prober.rng, round_):
                    elapsed = time.monotonic() - start
                    if out and elapsed + last > budget_s:
                        return out
                    t0 = time.monotonic()
                    out.append(await prober.run(client, spec))
                    await asyncio.sleep(0.05)  # back to idle before the next probe
                    last = time.monotonic() - t0
                    if on_probe:
                        on_probe(len(out), spec, time.monotonic() - start)
                round_ += 1

    return asyncio.run(main())
