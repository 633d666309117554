"""The router's HTTP API, a plain ASGI app: OpenAI completions and chat proxied to the picked endpoint,
/v1/models (the union over endpoints), /health, /metrics.

Plain ASGI rather than a framework: a routed request is one JSON parse, a few header reads and the
upstream call, and a framework's middleware layers (routing, body-size checks, exception handlers,
telemetry) cost more CPU per request than the router's own work.

Headers read: `authorization` (checked when the router has an API key; passed on as is unless an
upstream key replaces it), `x-slopilot-priority` (a band's priority or name),
`x-gateway-inference-objective` (an objective named in flowControl.objectives), the session header
of session-affinity-scorer. Errors are OpenAI-style bodies.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from types import SimpleNamespace

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane.router.config import RouterConfig
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pool import Pool
from controlplane.router.prompt import PromptReader, load_tokenizer, request_prompt
from controlplane.router.proxy import error_body, forward, forward_headers, respond
from controlplane.router.upstream import Upstream, UpstreamError

log = logging.getLogger("slopilot.router")

MAX_BODY_BYTES = 4 * 2**20
PRIORITY_HEADER = "x-slopilot-priority"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
PROXIED = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat


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
        self.upstream: Upstream | None = None  # proxied requests, scrapes, health checks, /v1/models
        self.expected_auth = f"Bearer {api_key}".encode() if api_key is not None else None


class RouterApp:
    """The ASGI app; `state.router` is the RouterState (pool, gate, metrics)."""

    def __init__(self, st: RouterState):
        self.st = st
        self.state = SimpleNamespace(router=st)
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # -- lifespan --------------------------------------------------------------------------------
    async def startup(self) -> None:
        st, cfg = self.st, self.st.cfg
        st.upstream = Upstream(cfg.connect_timeout)
        self._stop = asyncio.Event()
        await st.pool.refresh(st.upstream)  # know the endpoints before the first request
        self._task = asyncio.create_task(st.pool.run(st.upstream, self._stop))

    async def shutdown(self) -> None:
        self._stop.set()
        await self._task
        self.st.upstream.close()

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- requests --------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self.lifespan(receive, send)
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if method not in (("POST",) if path in PROXIED else ("GET", "HEAD")):
                return await json_error(send, 405, f"{method} is not allowed on {path}", "BadRequestError")
            if path in PROXIED:
                return await self.proxied(scope, receive, send, path)
            if path == "/v1/models":
                return await self.models(scope, send)
            if path == "/health":
                return await self.health(send)
            if path == "/metrics":
                st = self.st
                st.pool.publish()
                st.gate.publish()
                return await respond(send, 200, generate_latest(st.metrics.registry),
                                     [(b"content-type", CONTENT_TYPE_LATEST.encode())])
            return await json_error(send, 404, f"no route {path}", "NotFoundError")
        except Exception:  # a bug: an answer, and the traceback in the log
            log.exception("router error on %s %s", method, path)
            return await json_error(send, 500, "internal router error", "InternalServerError")

    def unauthorized(self, headers: dict[str, str]) -> bool:
        expected = self.st.expected_auth
        if expected is None:
            return False
        return not hmac.compare_digest(headers.get("authorization", "").encode(), expected)

    async def proxied(self, scope, receive, send, path: str) -> None:
        st, cfg = self.st, self.st.cfg
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.unauthorized(h):
            return await json_error(send, 401, "invalid or missing API key", "AuthenticationError")
        body = await read_body(receive)
        if body is None:
            return  # the client went away
        if len(body) > MAX_BODY_BYTES:
            return await json_error(send, 413, f"request body over {MAX_BODY_BYTES} bytes", "BadRequestError")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return await json_error(send, 400, f"malformed JSON body: {exc}", "BadRequestError")
        if not isinstance(data, dict):
            return await json_error(send, 400, "the body must be a JSON object", "BadRequestError")
        model = str(data.get("model") or "")
        try:
            priority = st.gate.priority(h.get(OBJECTIVE_HEADER), model, h.get(PRIORITY_HEADER))
        except Refused as exc:
            return await json_error(send, exc.status, str(exc), exc.kind)
        st.metrics.arrived(model, priority)
        hashes, tokens = st.reader.read(request_prompt(data, PROXIED[path]))
        p = Pending(hashes, tokens, h.get(cfg.session_header), priority, model, time.monotonic())
        try:
            await st.gate.acquire(p)
            headers = forward_headers(scope["headers"], st.upstream_key)
            streaming = bool(data.get("stream"))
            await forward(st.gate, st.upstream, p, path, body, headers, streaming, send, receive)
        except Refused as exc:
            st.metrics.errors.labels(model, str(priority), str(exc.status)).inc()
            await json_error(send, exc.status, str(exc), exc.kind)

    async def models(self, scope, send) -> None:
        st = self.st
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.unauthorized(h):
            return await json_error(send, 401, "invalid or missing API key", "AuthenticationError")
        headers = forward_headers(scope["headers"], st.upstream_key)

        async def one(url: str) -> list[dict]:
            try:
                status, body = await st.upstream.get(url, "/v1/models", st.cfg.scrape_timeout, headers)
                return json.loads(body).get("data", []) if status == 200 else []
            except (UpstreamError, ValueError, AttributeError):
                return []

        seen: dict[str, dict] = {}
        for data in await asyncio.gather(*(one(ep.url) for ep in st.pool.routable())):
            for model in data:
                if isinstance(model, dict) and "id" in model:
                    seen.setdefault(model["id"], model)
        await json_response(send, 200, {"object": "list", "data": list(seen.values())})

    async def health(self, send) -> None:
        st = self.st
        await json_response(send, 200, {"status": "ok", "ready_endpoints": len(st.pool.routable()),
                                        "queued": len(st.gate.queue)})


async def read_body(receive) -> bytes | None:
    """The request body (reading stops past MAX_BODY_BYTES); None when the client disconnected."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES or not message.get("more_body"):
            return b"".join(chunks)


JSON = [(b"content-type", b"application/json")]


async def json_response(send, status: int, obj) -> None:
    await respond(send, status, json.dumps(obj).encode(), JSON)


async def json_error(send, status: int, message: str, kind: str) -> None:
    await json_response(send, status, error_body(message, kind, status))


def build_router_app(cfg: RouterConfig, discover: Callable[[], list[str]], *, api_key: str | None = None,
                     upstream_key: str | None = None, pool_name: str = "default") -> RouterApp:
    """discover() -> the endpoints' base URLs now (called every refresh; must not block)."""
    return RouterApp(RouterState(cfg, discover, api_key, upstream_key, pool_name))
