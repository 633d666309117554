"""The router's HTTP API on its own HTTP server (controlplane.router.http): OpenAI completions and chat
proxied to the picked endpoint, /v1/models (the union over endpoints), /health, /metrics, and the
Batch API (/v1/files, /v1/batches: controlplane.batch, its lines through the gate's batch band).

No framework and no ASGI: a routed request is one JSON parse, a few header reads and the upstream
call, and a streamed answer is relayed from the upstream client's callbacks straight to the
client's socket (controlplane.router.proxy).

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

from controlplane.batch.service import BatchService, is_batch_path
from controlplane.router.answer import UpstreamError
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.http import MAX_BODY_BYTES, Connection, Request
from controlplane.router.metrics import RouterMetrics
from controlplane.router.pd import PDSettings, PrefillHop
from controlplane.router.pool import Pool
from controlplane.router.precise import KVEventsCollector, kv_feed
from controlplane.router.prompt import PromptReader, load_tokenizer, request_prompt
from controlplane.router.proxy import error_body, forward, forward_headers
from controlplane.router.upstream import Upstream
from routing.config import RouterConfig

log = logging.getLogger("slopilot.router")

PRIORITY_HEADER = "x-slopilot-priority"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
PROXIED = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat


class RouterState:
    def __init__(self, cfg: RouterConfig, discover: Callable[[], list[str]], api_key: str | None,
                 upstream_key: str | None, pool_name: str, state_dir: str | None = None,
                 batch_inflight: int = 64, pd: PDSettings | None = None,
                 batch_engine_priority: int | None = None):
        self.cfg, self.api_key, self.upstream_key = cfg, api_key, upstream_key
        self.metrics = RouterMetrics(pool_name)
        self.pool = Pool(cfg, discover, self.metrics)
        self.gate = Gate(cfg, self.pool, self.metrics)
        uses_prefix = self.gate.router.uses_prefix
        self.kv_events = kv_feed(cfg, self.gate.router)  # the precise scorer's KV event subscriber
        if self.kv_events is not None:
            self.metrics.registry.register(KVEventsCollector(self.kv_events))
            self.pool.on_leave = self.kv_events.index.forget
        self.reader = PromptReader(load_tokenizer(cfg.tokenizer, cfg.bos_token_id), cfg.prefix_block(),
                                   hashes=uses_prefix)
        self.upstream: Upstream | None = None  # proxied requests, scrapes, health checks, /v1/models
        self.expected_auth = f"Bearer {api_key}".encode() if api_key is not None else None
        # /v1/files, /v1/batches
        self.batch = BatchService(self, state_dir, batch_inflight, engine_priority=batch_engine_priority)
        self.pd = PrefillHop(pd, cfg, self.metrics) if pd is not None else None  # the P/D profile


class RouterApp:
    """The request handler and its lifespan; `state.router` is the RouterState (pool, gate, metrics)."""

    def __init__(self, st: RouterState):
        self.st = st
        self.state = SimpleNamespace(router=st)
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._prefill_task: asyncio.Task | None = None

    # -- lifespan --------------------------------------------------------------------------------
    async def startup(self) -> None:
        st, cfg = self.st, self.st.cfg
        st.upstream = Upstream(cfg.connect_timeout)
        self._stop = asyncio.Event()
        try:
            await st.pool.refresh(st.upstream)  # know the endpoints before the first request
        except Exception:  # the loop retries; a broken engine must not stop the router starting
            log.exception("the first endpoint refresh failed")
        self._task = asyncio.create_task(st.pool.supervise(st.upstream, self._stop))
        if st.pd is not None:  # the prefill endpoints: a pool of their own, refreshed and checked alike
            try:
                await st.pd.pool.refresh(st.upstream)
            except Exception:
                log.exception("the first prefill endpoint refresh failed")
            self._prefill_task = asyncio.create_task(st.pd.pool.supervise(st.upstream, self._stop))
        st.batch.start()
        if st.kv_events is not None:
            st.kv_events.start()

    async def shutdown(self) -> None:
        self._stop.set()
        await self.st.batch.stop()
        await self._task
        if self._prefill_task is not None:
            await self._prefill_task
        self.st.upstream.close()
        if self.st.kv_events is not None:
            self.st.kv_events.close()

    # -- requests --------------------------------------------------------------------------------
    async def handle(self, req: Request, conn: Connection) -> None:
        path, method = req.path, req.method
        try:
            if is_batch_path(path):
                return await self.batch(req, conn)
            if method not in (("POST",) if path in PROXIED else ("GET", "HEAD")):
                return json_error(conn, 405, f"{method} is not allowed on {path}", "BadRequestError")
            if path in PROXIED:
                return await self.proxied(req, conn)
            if path == "/v1/models":
                return await self.models(req, conn)
            if path == "/health":
                return self.health(req, conn)
            if path == "/metrics":
                st = self.st
                st.pool.publish()
                st.gate.publish()
                if st.pd is not None:
                    st.pd.pool.publish()
                return conn.respond(200, [(b"content-type", CONTENT_TYPE_LATEST.encode())],
                                    generate_latest(st.metrics.registry), head_only=method == "HEAD")
            return json_error(conn, 404, f"no route {path}", "NotFoundError")
        except Exception:  # a bug: an answer, and the traceback in the log
            log.exception("router error on %s %s", method, path)
            return json_error(conn, 500, "internal router error", "InternalServerError")

    def unauthorized(self, headers: dict[str, str]) -> bool:
        expected = self.st.expected_auth
        if expected is None:
            return False
        return not hmac.compare_digest(headers.get("authorization", "").encode(), expected)

    async def proxied(self, req: Request, conn: Connection) -> None:
        st, cfg = self.st, self.st.cfg
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
        if self.unauthorized(h):
            return json_error(conn, 401, "invalid or missing API key", "AuthenticationError")
        if req.too_large:
            return json_error(conn, 413, f"request body over {MAX_BODY_BYTES} bytes", "BadRequestError")
        body = req.body
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return json_error(conn, 400, f"malformed JSON body: {exc}", "BadRequestError")
        if not isinstance(data, dict):
            return json_error(conn, 400, "the body must be a JSON object", "BadRequestError")
        model = str(data.get("model") or "")
        try:
            priority = st.gate.priority(h.get(OBJECTIVE_HEADER), model, h.get(PRIORITY_HEADER))
        except Refused as exc:
            return json_error(conn, exc.status, str(exc), exc.kind)
        st.metrics.arrived(model, priority)
        hashes, tokens = st.reader.read(request_prompt(data, PROXIED[req.path]))
        st.metrics.tokens(priority, tokens, data.get("max_completion_tokens", data.get("max_tokens")))
        p = Pending(hashes, tokens, h.get(cfg.session_header), priority, model, time.monotonic())
        split = st.pd is not None and st.pd.decide(st.gate, p)  # before the pick records the prefix
        try:
            await st.gate.acquire(p)
            headers = forward_headers(req.headers, st.upstream_key)
            if split:
                body = await self.prefill(p, req.path, data, headers)
            streaming = bool(data.get("stream"))
            await forward(st.gate, st.upstream, p, req.path, body, headers, streaming, conn)
        except Refused as exc:
            st.metrics.errors.labels(model, str(priority), str(exc.status)).inc()
            json_error(conn, exc.status, str(exc), exc.kind)

    async def prefill(self, p: Pending, path: str, data: dict, headers: bytes) -> bytes:
        """The P/D profile's first hop; the decode hop's body. On failure the decode slot is freed."""
        try:
            return await self.st.pd.run(self.st.upstream, path, data, headers, p)
        except BaseException:
            self.st.gate.release(p)
            raise

    async def batch(self, req: Request, conn: Connection) -> None:
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
        if self.unauthorized(h):
            return json_error(conn, 401, "invalid or missing API key", "AuthenticationError")
        await self.st.batch.handle(req, conn)

    async def models(self, req: Request, conn: Connection) -> None:
        st = self.st
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
        if self.unauthorized(h):
            return json_error(conn, 401, "invalid or missing API key", "AuthenticationError")
        headers = forward_headers(req.headers, st.upstream_key)

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
        json_response(conn, 200, {"object": "list", "data": list(seen.values())}, req.method == "HEAD")

    def health(self, req: Request, conn: Connection) -> None:
        st = self.st
        problem = st.pool.loop_problem()  # held requests are dispatched from that loop
        json_response(conn, 503 if problem else 200,
                      {"status": problem or "ok", "ready_endpoints": len(st.pool.routable()),
                       "queued": len(st.gate.queue), "refresh_restarts": st.pool.loop_restarts,
                       **({"ready_prefill_endpoints": len(st.pd.pool.routable())} if st.pd else {})},
                      req.method == "HEAD")


JSON = [(b"content-type", b"application/json")]


def json_response(conn: Connection, status: int, obj, head_only: bool = False) -> None:
    conn.respond(status, JSON, json.dumps(obj).encode(), head_only)


def json_error(conn: Connection, status: int, message: str, kind: str) -> None:
    json_response(conn, status, error_body(message, kind, status))


def build_router_app(cfg: RouterConfig, discover: Callable[[], list[str]], *, api_key: str | None = None,
                     upstream_key: str | None = None, pool_name: str = "default",
                     state_dir: str | None = None, batch_inflight: int = 64,
                     pd: PDSettings | None = None, batch_engine_priority: int | None = None) -> RouterApp:
    """discover() -> the endpoints' base URLs now (called every refresh; must not block). state_dir: the
    Batch API's store (none: in memory); batch_inflight: batch lines out at a time;
    batch_engine_priority: the `priority` field batch lines are sent with (none: not sent)."""
    return RouterApp(RouterState(cfg, discover, api_key, upstream_key, pool_name, state_dir, batch_inflight,
                                 pd, batch_engine_priority))
