"""The router's HTTP API (FastAPI): OpenAI completions and chat proxied to the picked endpoint,
/v1/models (the union over endpoints), /health, /metrics.

Headers read: `authorization` (checked when the router has an API key; passed on as is unless an
upstream key replaces it), `x-slopilot-priority` (a band's priority or name),
`x-gateway-inference-objective` (an objective named in flowControl.objectives), the session header
of session-affinity-scorer. Errors are OpenAI-style bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import Callable

import httpx
from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from controlplane.router.config import RouterConfig
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pool import Pool
from controlplane.router.prompt import PromptReader, load_tokenizer, request_prompt
from controlplane.router.proxy import error_response, forward, forward_headers, upstream_session

MAX_BODY_BYTES = 4 * 2**20
PRIORITY_HEADER = "x-slopilot-priority"
OBJECTIVE_HEADER = "x-gateway-inference-objective"


class RouterState:
    def __init__(self, cfg: RouterConfig, discover: Callable[[], list[str]], api_key: str | None,
                 upstream_key: str | None, pool_name: str):
        self.cfg, self.api_key, self.upstream_key = cfg, api_key, upstream_key
        self.metrics = RouterMetrics(pool_name)
        self.pool = Pool(cfg, discover, self.metrics)
        self.gate = Gate(cfg, self.pool, self.metrics)
        uses_prefix = self.gate.router.uses_prefix
        self.reader = PromptReader(load_tokenizer(cfg.tokenizer, cfg.bos_token_id), cfg.prefix_block(),
                                   hashes=uses_prefix)
        self.client: httpx.AsyncClient | None = None  # metrics, health, models
        self.session = None  # the proxy's aiohttp session


def build_router_app(cfg: RouterConfig, discover: Callable[[], list[str]], *, api_key: str | None = None,
                     upstream_key: str | None = None, pool_name: str = "default") -> FastAPI:
    """discover() -> the endpoints' base URLs now (called every refresh; must not block)."""
    st = RouterState(cfg, discover, api_key, upstream_key, pool_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        timeout = httpx.Timeout(None, connect=cfg.connect_timeout)
        st.client = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
        st.session = upstream_session(cfg.connect_timeout)
        stop = asyncio.Event()
        await st.pool.refresh(st.client)  # know the endpoints before the first request
        task = asyncio.create_task(st.pool.run(st.client, stop))
        yield
        stop.set()
        await task
        await st.client.aclose()
        await st.session.close()

    app = FastAPI(title="slopilot router", lifespan=lifespan)
    app.state.router = st

    def unauthorized(request: Request) -> Response | None:
        if st.api_key is None:
            return None
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {st.api_key}".encode()):
            return error_response(401, "invalid or missing API key", "AuthenticationError")
        return None

    async def proxied(request: Request, path: str, chat: bool) -> Response:
        if (denied := unauthorized(request)) is not None:
            return denied
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return error_response(413, f"request body over {MAX_BODY_BYTES} bytes", "BadRequestError")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"malformed JSON body: {exc}", "BadRequestError")
        if not isinstance(data, dict):
            return error_response(400, "the body must be a JSON object", "BadRequestError")
        model = str(data.get("model") or "")
        h = request.headers
        try:
            priority = st.gate.priority(h.get(OBJECTIVE_HEADER), model, h.get(PRIORITY_HEADER))
        except Refused as exc:
            return error_response(exc.status, str(exc), exc.kind)
        st.metrics.requests.labels(model, str(priority)).inc()
        hashes, tokens = st.reader.read(request_prompt(data, chat))
        p = Pending(hashes, tokens, h.get(cfg.session_header), priority, model, time.monotonic())
        try:
            await st.gate.acquire(p)
            return await forward(st.gate, st.session, p, path, body, forward_headers(h, st.upstream_key),
                                 bool(data.get("stream")))
        except Refused as exc:
            st.metrics.errors.labels(model, str(priority), str(exc.status)).inc()
            return error_response(exc.status, str(exc), exc.kind)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxied(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await proxied(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        if (denied := unauthorized(request)) is not None:
            return denied
        headers = forward_headers(request.headers, st.upstream_key)

        async def one(url: str) -> list[dict]:
            try:
                r = await st.client.get(url + "/v1/models", headers=headers, timeout=cfg.scrape_timeout)
                return r.json().get("data", []) if r.status_code == 200 else []
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        seen: dict[str, dict] = {}
        for data in await asyncio.gather(*(one(ep.url) for ep in st.pool.routable())):
            for model in data:
                if isinstance(model, dict) and "id" in model:
                    seen.setdefault(model["id"], model)
        return {"object": "list", "data": list(seen.values())}

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok", "ready_endpoints": len(st.pool.routable()),
                             "queued": len(st.gate.queue)})

    @app.get("/metrics")
    async def metrics():
        st.pool.publish()
        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
