"""The OpenAI-compatible HTTP API (FastAPI) over an AsyncEngine, shaped as vLLM serves it.

Errors are OpenAI-style {"error": {message, type, param, code}} bodies: 400 for any bad request
(malformed JSON, wrong types, an unknown model, max_tokens < 1, too long for the context, an empty
prompt), 401 for a missing or wrong API key, 429 when the waiting queue is full, 503 while the
model is loading or after the engine loop died.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from engine.core.sampling_params import SamplingParams
from engine.server.async_engine import AsyncEngine, Update
from engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    apply_chat_template,
    error_body,
)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    try:
        return pkg_version("slopilot")
    except PackageNotFoundError:
        return "0.1.0"


class GateMiddleware:
    """Pure ASGI (streaming-safe): API key and model-loading checks on /v1 before any body parsing."""

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            error = None
            key = self.state.api_key
            if key is not None:
                headers = dict(scope["headers"])
                if headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {key}":
                    error = APIError(401, "missing or invalid API key", "AuthenticationError")
            if error is None and not self.state.ready():
                error = APIError(503, "the model is still loading", "ServiceUnavailableError")
            if error is not None:
                await JSONResponse(error.body(), error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ServerState:
    def __init__(self, engine: AsyncEngine, model_name: str, api_key: str | None, max_waiting: int | None,
                 health_hold: float):
        self.engine, self.model_name, self.api_key = engine, model_name, api_key
        self.max_waiting, self.health_hold = max_waiting, health_hold
        self.ready_at = float("inf")  # set when the app starts

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at and self.engine.alive


def build_app(engine: AsyncEngine, model_name: str, api_key: str | None = None,
              max_waiting: int | None = None, health_hold: float = 0.0) -> FastAPI:
    state = ServerState(engine, model_name, api_key, max_waiting, health_hold)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start(asyncio.get_running_loop())
        state.ready_at = time.monotonic() + health_hold
        yield
        engine.stop()

    app = FastAPI(title="slopilot engine", version=version(), lifespan=lifespan)
    app.state.server = state
    app.add_middleware(GateMiddleware, state=state)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # e.g. an undecodable body, 404, 405
        kind = "BadRequestError" if exc.status_code == 400 else "HTTPError"
        return JSONResponse(error_body(str(exc.detail), kind, exc.status_code), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid")
        if first.get("type") == "json_invalid":  # loc is then the byte offset, not a field
            message = f"malformed JSON body: {first.get('ctx', {}).get('error', 'invalid JSON')}"
            where = ""
        return JSONResponse(error_body(message, "BadRequestError", 400, where or None), 400)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.ready() else 503)

    @app.get("/version")
    async def get_version():
        return {"version": version()}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "slopilot",
            "root": model_name, "parent": None, "max_model_len": engine.max_model_len, "permission": []}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        ids = _prompt_ids(engine, req.prompt)
        if req.echo or req.logprobs is not None:
            param = "echo" if req.echo else "logprobs"
            raise APIError(400, "echo and logprobs are not supported", param=param)
        return await _generate(state, raw, req, ids, req.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        if req.logprobs:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        ids = engine.tokenizer.encode(apply_chat_template(req.messages))
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await _generate(state, raw, req, ids, max_tokens, chat=True)

    return app


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
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
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


def _validate(state: ServerState, req: SamplingFields, ids: list[int], max_tokens: int | None) -> int:
    engine = state.engine
    if req.model is not None and req.model != state.model_name:
        raise APIError(400, f"The model `{req.model}` does not exist (this server serves "
                            f"`{state.model_name}`).", "NotFoundError", "model")
    if req.n != 1:
        raise APIError(400, f"only n=1 is supported, got {req.n}", param="n")
    limit = engine.max_model_len
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
    if not engine.alive:
        raise APIError(503, engine.error or "the engine is not running", "ServiceUnavailableError")
    if state.max_waiting is not None and engine.pending >= state.max_waiting:
        raise APIError(429, f"the server is overloaded: {engine.pending} requests are waiting "
                            f"(--max-waiting {state.max_waiting})", "RateLimitError")
    return max_tokens


async def _generate(state: ServerState, raw: Request, req: SamplingFields, ids: list[int],
                    max_tokens: int | None, chat: bool):
    max_tokens = _validate(state, req, ids, max_tokens)
    params = _sampling_params(req, max_tokens)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    arrival = state.engine.engine.clock()
    stream = state.engine.add(request_id, ids, params, arrival, req.priority)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    shaper = Shaper(request_id, state.model_name, chat)
    if req.stream:
        return StreamingResponse(_sse(state.engine, request_id, stream, shaper, params.stop, include_usage),
                                 media_type="text/event-stream")
    final = await _wait_final(state.engine, request_id, stream, raw)
    if final.error:
        status = 503 if not state.engine.alive else 400
        raise APIError(status, final.error, "ServiceUnavailableError" if status == 503 else "BadRequestError")
    return shaper.response(final)


async def _wait_final(engine: AsyncEngine, request_id: str, stream: asyncio.Queue[Update],
                      raw: Request) -> Update:
    """The last update; aborts the request if the client disconnects first."""
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
        if not result.done():
            result.cancel()
            engine.abort(request_id)
    return result.result()


def visible_text(text: str, stops: list[str], finished: bool) -> str:
    """What may be streamed so far: the tail that could still become a stop string is held back,
    and so is a trailing replacement character (half of a multi-byte UTF-8 character)."""
    if finished:
        return text
    hold = max((len(s) for s in stops), default=1) - 1
    if hold:
        text = text[:max(len(text) - hold, 0)]
    return text.rstrip("\ufffd")


def _event(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _sse(engine: AsyncEngine, request_id: str, stream: asyncio.Queue[Update], shaper: Shaper,
               stops: list[str], include_usage: bool) -> AsyncIterator[str]:
    done = False
    sent = ""
    try:
        if shaper.chat:
            yield _event(shaper.chunk("", None, first=True))
        while True:
            update = await stream.get()
            if update.error:
                done = True
                yield _event(error_body(update.error, "ServiceUnavailableError", 503))
                break
            finished = update.finish_reason is not None
            text = visible_text(update.text, stops, finished)
            delta = ""
            if text.startswith(sent):  # a tokenizer may re-spell earlier text: never repeat it
                delta, sent = text[len(sent):], text
            # a chunk for every token, even one with no text yet (as vLLM streams completions)
            yield _event(shaper.chunk(delta, update.finish_reason))
            if finished:
                done = True
                if include_usage:
                    yield _event(shaper.usage_chunk(update))
                break
        yield _event("[DONE]")
    finally:
        if not done:  # the client went away mid-stream: free its KV blocks
            engine.abort(request_id)


class Shaper:
    """Response and chunk bodies of one request, in OpenAI's (and vLLM's) shapes."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(update: Update) -> dict:
        return {"prompt_tokens": update.num_prompt_tokens, "completion_tokens": update.num_output_tokens,
                "total_tokens": update.num_prompt_tokens + update.num_output_tokens}

    def response(self, update: Update) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": update.text},
                      "logprobs": None, "finish_reason": update.finish_reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage(update)}
        choice = {"index": 0, "text": update.text, "logprobs": None, "finish_reason": update.finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": self.usage(update)}

    def chunk(self, text: str, finish_reason: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, update: Update) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(update)}
