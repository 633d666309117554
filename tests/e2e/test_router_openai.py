"""The router with the official `openai` client: answers identical to the engine's own, streams
passed through with their usage, 100 concurrent streams, API keys, /v1/models, and an engine killed
under load (retries before the first byte, error events mid-stream, ejection and readmission)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from controlplane.prometheus_server import free_port
from controlplane.router.app import build_router_app
from controlplane.router.discovery import static
from controlplane.router.server import RouterServer
from routing.config import load_router_config
from tests.e2e.conftest import ROOT, EmulatedServer, wait_for, wait_healthy


def start_router(urls, config=None, discover=None, **kw) -> RouterServer:
    """The router in a thread, in front of fixed `urls` (or what `discover()` returns)."""
    return RouterServer(build_router_app(load_router_config(config), discover or static(urls), **kw)).start()


class Engine(EmulatedServer):
    """`slopilot serve ARGS --port P` (any model), restartable on the same port."""

    def __init__(self, *args: str):
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.start()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", *self.args, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)


@pytest.fixture
def tiny_server():
    """One `serve --model tiny` (real weights, prefix caching), deterministic at temperature 0."""
    s = Engine("--model", "tiny", "--max-model-len", "512")
    wait_healthy([s], timeout=120)
    yield s
    s.stop()


def _same(a, b, fields=("choices", "usage", "model", "object")):
    da, db = a.model_dump(), b.model_dump()
    return {f: da[f] for f in fields} == {f: db[f] for f in fields}


def test_openai_client_through_the_router_matches_the_engine(tiny_server):
    with start_router([tiny_server.url]) as router:
        direct = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x")
        routed = openai.OpenAI(base_url=router.url + "/v1", api_key="x")
        kw = dict(model="tiny", max_tokens=12, temperature=0.0)
        a = direct.completions.create(prompt="The quick brown fox", **kw)
        b = routed.completions.create(prompt="The quick brown fox", **kw)
        assert _same(a, b) and b.usage.completion_tokens == 12
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
        a = direct.chat.completions.create(messages=msgs, **kw)
        b = routed.chat.completions.create(messages=msgs, **kw)
        assert _same(a, b) and b.choices[0].message.content == a.choices[0].message.content

        def stream(client, chat):
            opts = dict(stream=True, stream_options={"include_usage": True}, **kw)
            s = (client.chat.completions.create(messages=msgs, **opts) if chat
                 else client.completions.create(prompt="Once upon a time", **opts))
            chunks = list(s)
            text = "".join((c.choices[0].delta.content or "") if chat else c.choices[0].text
                           for c in chunks if c.choices)
            return text, chunks[-1].usage.model_dump(), len(chunks)

        for chat in (False, True):
            # the same text, usage and number of chunks: streamed chunk by chunk, usage chunk kept
            assert stream(direct, chat) == stream(routed, chat)
        ids = [m.id for m in routed.models.list().data]
        assert ids == [m.id for m in direct.models.list().data] == ["tiny"]


def test_api_key_enforced_or_passed_through(emulated_servers):
    guarded = emulated_servers(1, "--api-key", "engine-key")[0]
    with start_router([guarded]) as router:  # passed through: the engine decides
        ok = openai.OpenAI(base_url=router.url + "/v1", api_key="engine-key")
        assert ok.completions.create(model="llama2-70b", prompt="hi", max_tokens=2).usage.total_tokens > 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=router.url + "/v1", api_key="wrong").completions.create(
                model="llama2-70b", prompt="hi", max_tokens=2)
    with start_router([guarded], api_key="router-key", upstream_key="engine-key") as router:
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=router.url + "/v1", api_key="engine-key").completions.create(
                model="llama2-70b", prompt="hi", max_tokens=2)
        assert err.value.status_code == 401
        ok = openai.OpenAI(base_url=router.url + "/v1", api_key="router-key")
        assert ok.completions.create(model="llama2-70b", prompt="hi", max_tokens=2).usage.total_tokens > 2


def test_bad_requests_get_openai_errors(emulated_servers):
    urls = emulated_servers(1)
    with start_router(urls) as router:
        r = httpx.post(router.url + "/v1/completions", content=b"{not json", trust_env=False)
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
        r = httpx.post(router.url + "/v1/completions", json={"prompt": "x", "max_tokens": -1},
                       trust_env=False)
        assert r.status_code == 400 and "error" in r.json()  # the engine's own 400, passed back


async def _streams(base: str, n: int, max_tokens: int = 16, started: list | None = None
                   ) -> list[tuple[str, int | None]]:
    """n concurrent streams; (outcome, completion tokens) each; `started` gets an entry per stream
    at its first chunk."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120)

    async def one(i: int):
        try:
            s = await client.completions.create(
                model="llama2-70b", prompt=f"request {i} " * 20, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            chunks = []
            async for c in s:
                if not chunks and started is not None:
                    started.append(i)
                chunks.append(c)
            return "ok", chunks[-1].usage.completion_tokens
        except openai.APIError as exc:
            return type(exc).__name__, None

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def test_100_concurrent_streams_complete(emulated_servers):
    urls = emulated_servers(2)
    with start_router(urls) as router:
        results = asyncio.run(_streams(router.url, 100))
        assert results == [("ok", 16)] * 100
        served = [ep.served for ep in router.state.pool.endpoints.values()]
        assert sum(served) == 100 and min(served) > 0  # both engines took a share


class Unavailable(BaseHTTPRequestHandler):
    """An engine that is up (/health 200) but answers every request 503, as one that is overloaded or
    still loading; counts the requests it refused."""

    refused = 0

    def do_GET(self):
        body = b'{"object": "list", "data": []}' if self.path.startswith("/v1/models") else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).refused += 1
        body = b'{"error": {"message": "busy", "type": "ServiceUnavailable", "code": 503}}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_503_before_the_first_byte_is_retried_on_another_endpoint(emulated_servers):
    (url,) = emulated_servers(1)
    busy = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    busy_url = f"http://127.0.0.1:{busy.server_port}"
    model = httpx.get(url + "/v1/models", trust_env=False).json()["data"][0]["id"]
    config = {"kind": "EndpointPickerConfig", "plugins": [{"type": "round-robin-picker"}]}
    try:
        with start_router([busy_url, url], config) as router:
            for stream in (False, True, False, True):
                r = httpx.post(router.url + "/v1/completions", timeout=30, trust_env=False, json={
                    "model": model, "prompt": "hello", "max_tokens": 4, "stream": stream})
                assert r.status_code == 200, r.text
                assert ("data: [DONE]" in r.text) if stream else r.json()["usage"]["completion_tokens"] == 4
            eps = router.state.pool.endpoints
            # the picker sent some there (and ejected it on the first 503); each was retried on the engine
            assert eps[busy_url].served == Unavailable.refused >= 1 and eps[url].served == 4
    finally:
        busy.shutdown()


def test_client_gone_mid_stream_ends_the_engine_request(emulated_servers):
    urls = emulated_servers(1)

    def running() -> float:
        text = httpx.get(urls[0] + "/metrics?name[]=vllm:num_requests_running", trust_env=False).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_req"))

    with start_router(urls) as router:
        body = {"model": "llama2-70b", "prompt": "hi", "max_tokens": 4000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=body, trust_env=False) as r:
            assert r.status_code == 200
            chunks = r.iter_bytes()  # kept: a dropped iterator closes the response at once
            next(chunks)  # the first chunk (a minute or more of tokens to come)
            wait_for(lambda: running() == 1, 10, what="the engine running the stream")
        # the client has gone (the response closed)
        ep = router.state.pool.endpoints[urls[0]]
        wait_for(lambda: ep.outstanding == 0 and running() == 0, 10,
                 what="the engine's request ended after the client left")


@pytest.mark.slow  # about 25 s on two shared cores
def test_engine_killed_under_load():
    servers = [Engine("--emulate", "h100-llama2-70b-tp4") for _ in range(3)]
    try:
        wait_healthy(servers)
        _killed_under_load([s.url for s in servers], servers[0])
    finally:
        for s in servers:
            s.stop()


def _killed_under_load(urls: list[str], victim: Engine) -> None:
    cfg = {"kind": "EndpointPickerConfig", "dataLayer": {"healthCheckInterval": "200ms"}}
    with start_router(urls, cfg) as router:
        async def run():
            started: list[int] = []
            load = asyncio.create_task(_streams(router.url, 120, max_tokens=300, started=started))
            while len(started) < 90:  # most streams are under way, about a third on the victim
                await asyncio.sleep(0.05)
            running = router.state.pool.endpoints[urls[0]].outstanding
            victim.proc.kill()  # mid-load: some streams were running on it
            print(f"killed an engine with {running} streams in flight on it")
            return await load

        results = asyncio.run(run())
        ok = [r for r in results if r[0] == "ok"]
        broken = [r for r in results if r[0] != "ok"]
        print(f"{len(ok)} streams completed, {len(broken)} ended with an error event")
        # every request that had not started streaming went elsewhere; only streams running on the
        # killed engine ended, each with an error event (APIError from the client's stream)
        assert len(ok) + len(broken) == 120 and all(r == ("ok", 300) for r in ok)
        assert 0 < len(broken) <= router.state.pool.endpoints[urls[0]].served
        assert all(name == "APIError" for name, _ in broken), broken[:3]
        ep = router.state.pool.endpoints[urls[0]]
        assert not ep.healthy  # ejected
        victim.start()  # it returns on the same port: the health check readmits it
        wait_for(lambda: ep.healthy, 60, what="readmission of the restarted engine")
        before = ep.served
        results = asyncio.run(_streams(router.url, 30, max_tokens=4))
        assert results == [("ok", 4)] * 30 and ep.served > before
        text = httpx.get(router.url + "/metrics", trust_env=False).text
        assert f'slopilot_router_ejections_total{{endpoint="{urls[0]}"}} 1.0' in text
