"""The OpenAI-compatible HTTP API (FastAPI) over an AsyncEngine, shaped as vLLM serves it.

Errors are OpenAI-style {"error": {message, type, param, code}} bodies: 400 for any bad request
(malformed JSON, wrong types, values outside vLLM's ranges, text that is not UTF-8, too long for
the context), 401 for a missing or wrong API key, 404 for an unknown model, 413 for a body over
the size limit, 429 when the waiting queue is full, 500 for a request that failed inside the
engine (that request only), 503 while the model is loading, after the engine loop died or once
the server is shutting down.

A long prompt is tokenized in a worker thread, so it never stalls /health or other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from engine.core.sampling_params import SamplingParams
from engine.server import defaults
from engine.server.async_engine import AsyncEngine, Update
from engine.server.defaults import version
from engine.server.gate import Gate
from engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    apply_chat_template,
    error_body,
)
from engine.server.responses import ERROR_TYPES, Shaper, sse

log = logging.getLogger("slopilot.server")

# longer prompts (characters or token ids) are tokenized off the event loop; shorter ones take
# well under a few milliseconds, less than the hop to a worker thread costs under load
INLINE_TOKENIZE_MAX = 8192


class ServerState:
    def __init__(self, engine: AsyncEngine, model_name: str, max_waiting: int | None, health_hold: float):
        self.engine, self.model_name = engine, model_name
        self.max_waiting, self.health_hold = max_waiting, health_hold
        self.ready_at = float("inf")  # set when the app starts
        self.admitting = 0  # requests past the queue check, not yet added to the engine (tokenizing)
        # one thread: tokenizing is CPU work under the GIL, and every thread more doing it at once
        # would take another share of the interpreter from the event loop
        self.tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def not_ready(self) -> str | None:
        """Why requests cannot run now (the 503 message), or None."""
        if self.engine.error:
            return self.engine.error
        if self.engine.closed:
            return self.engine.closed
        if time.monotonic() < self.ready_at or not self.engine.alive:
            return "the model is still loading"
        return None


def build_app(engine: AsyncEngine, model_name: str, *, api_key: str | None = None,
              protect_metrics: bool = False, max_waiting: int | None = defaults.MAX_WAITING,
              max_request_bytes: int = defaults.MAX_REQUEST_BYTES, health_hold: float = 0.0,
              body_timeout: float = defaults.BODY_TIMEOUT_S) -> FastAPI:
    """api_key guards /v1 (and /metrics with protect_metrics); max_waiting None: no queue bound."""
    state = ServerState(engine, model_name, max_waiting, health_hold)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start(asyncio.get_running_loop())
        state.ready_at = time.monotonic() + health_hold
        yield
        engine.stop()
        state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="slopilot engine", version=version(), lifespan=lifespan)
    app.state.server = state
    # past the queue bound, requests beyond those the engine may run at once can only get 429
    in_flight = None if max_waiting is None else max_waiting + engine.engine.scheduler.max_num_seqs
    app.add_middleware(Gate, api_key=api_key, protect_metrics=protect_metrics,
                       max_body_bytes=max_request_bytes, max_in_flight=in_flight, ready=state.not_ready,
                       body_timeout=body_timeout)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # e.g. an undecodable body, 404, 405
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(exc.status_code, "HTTPError")
        return JSONResponse(error_body(str(exc.detail), kind, exc.status_code), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return JSONResponse(_validation_body(exc.errors()), 400)

    @app.get("/version")
    async def get_version():
        return {"version": version()}

    @app.get("/metrics")
    async def metrics(request: Request):
        names = request.query_params.getlist("name[]")
        return Response(engine.metrics.render(names), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "slopilot",
            "root": model_name, "parent": None, "max_model_len": engine.max_model_len, "permission": []}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        return await _serve(state, raw, req, req.prompt, req.max_tokens, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await _serve(state, raw, req, apply_chat_template(req.messages), max_tokens, True)

    return app


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _validation_body(errors: list) -> dict:
    """One validation error as a 400 body: param is the top-level field, the message its path. A
    value that fails one of our checks (e.g. not UTF-8) says more than a union branch it does not fit."""
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
    if first.get("type") == "json_invalid":  # loc is then the byte offset, not a field
        return error_body(f"malformed JSON body: {first.get('ctx', {}).get('error', 'invalid JSON')}",
                          "BadRequestError", 400)
    # union branches show up in loc as type tags ("str", "function-after[...]"): not fields
    path = [str(p) for p in first.get("loc", ()) if p != "body"
            and not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    message = first.get("msg", "invalid request")
    return error_body(f"{'.'.join(path)}: {message}" if path else message, "BadRequestError", 400,
                      path[0] if path else None)


def _prompt_size(prompt) -> int:
    """Characters or token ids: what tokenizing (or checking) the prompt costs."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return sum(len(p) for p in prompt)
    return len(prompt)


def _prompt_ids(engine: AsyncEngine, prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"batched prompts are not supported (got {len(prompt)})", param="prompt")
        prompt = prompt[0]
    if len(prompt) == 0:
        raise APIError(400, "the prompt is empty", param="prompt")
    if isinstance(prompt, str):
        return engine.tokenizer.encode(prompt)
    vocab = engine.tokenizer.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="prompt")
    return list(prompt)


def _sampling_params(req: SamplingFields, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k in (None, 0) else req.top_k,
            seed=req.seed, max_tokens=max_tokens, stop=req.stop, stop_token_ids=req.stop_token_ids or [],
            ignore_eos=req.ignore_eos)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _admit(state: ServerState, req: SamplingFields) -> None:
    """Checks that need no tokens, before any work is spent on the request."""
    if req.model is not None and req.model != state.model_name:
        raise APIError(404, f"The model `{req.model}` does not exist (this server serves "
                            f"`{state.model_name}`).", "NotFoundError", "model")
    if (problem := req.unsupported()) is not None:
        raise APIError(400, problem[1], param=problem[0])
    _check_running(state)
    queued = state.engine.pending + state.admitting
    if state.max_waiting is not None and queued >= state.max_waiting:
        raise APIError(429, f"the server is overloaded: {queued} requests are waiting "
                            f"(--max-waiting {state.max_waiting})", "RateLimitError")


def _check_running(state: ServerState) -> None:
    if (why := state.engine.error or state.engine.closed) is not None:
        raise APIError(503, why, "ServiceUnavailableError")


def _max_tokens(state: ServerState, ids: list[int], max_tokens: int | None) -> int:
    limit = state.engine.max_model_len
    if len(ids) >= limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens. However, the "
                            f"prompt has {len(ids)} tokens, leaving no room to generate.", param="prompt")
    if max_tokens is None:
        max_tokens = limit - len(ids)
    if max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    if len(ids) + max_tokens > limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you "
                            f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                            f"{max_tokens} in the completion).", param="max_tokens")
    return max_tokens


async def _serve(state: ServerState, raw: Request, req: SamplingFields, prompt, max_tokens: int | None,
                 chat: bool):
    _admit(state, req)
    state.admitting += 1
    try:
        if _prompt_size(prompt) <= INLINE_TOKENIZE_MAX:
            ids = _prompt_ids(state.engine, prompt)
        else:  # in the tokenizer thread: /health and the other requests go on meanwhile
            loop = asyncio.get_running_loop()
            ids = await loop.run_in_executor(state.tokenizer_pool, _prompt_ids, state.engine, prompt)
        max_tokens = _max_tokens(state, ids, max_tokens)
        params = _sampling_params(req, max_tokens)
        _check_running(state)  # the engine may have died or closed while we tokenized
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stream = state.engine.add(request_id, ids, params, state.engine.engine.clock(), req.priority,
                                  req.kv_transfer_params)
        del ids  # the engine keeps its own copy; a queued request holds no second one
    finally:
        state.admitting -= 1
    shaper = Shaper(request_id, state.model_name, chat)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(sse(state.engine, request_id, stream, shaper, params.stop, include_usage),
                                 media_type="text/event-stream")
    final = await _wait_final(state.engine, request_id, stream, raw)
    if final is None:  # nobody is listening any more
        return Response(status_code=499)
    if final.error:
        raise APIError(final.status, final.error, ERROR_TYPES.get(final.status, "APIError"))
    return shaper.response(final)


async def _wait_final(engine: AsyncEngine, request_id: str, stream: asyncio.Queue[Update],
                      raw: Request) -> Update | None:
    """The last update, or None (and the request aborted) if the client disconnects first."""
    async def final() -> Update:
        while True:
            update = await stream.get()
            if update.finish_reason is not None:
                return update

    async def disconnected() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    result, watcher = asyncio.ensure_future(final()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        gone = not result.done()
        if gone:
            result.cancel()
            log.info("request %s aborted: the client disconnected", request_id)
            engine.abort(request_id)
    return None if gone else result.result()
