"""Response bodies and the event stream of one request, in OpenAI's (and vLLM's) shapes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from engine.server.async_engine import AsyncEngine, Update
from engine.server.protocol import error_body

log = logging.getLogger("slopilot.server")

ERROR_TYPES = {400: "BadRequestError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


def visible_text(text: str, stops: list[str], finished: bool) -> str:
    """What may be streamed so far: the tail that could still become a stop string is held back,
    and so is a trailing replacement character (half of a multi-byte UTF-8 character)."""
    if finished:
        return text
    hold = max((len(s) for s in stops), default=1) - 1
    if hold:
        text = text[:max(len(text) - hold, 0)]
    return text.rstrip("\ufffd")


def event(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def sse(engine: AsyncEngine, request_id: str, stream: asyncio.Queue[Update], shaper: Shaper,
               stops: list[str], include_usage: bool) -> AsyncIterator[str]:
    done = False
    sent = ""
    try:
        if shaper.chat:
            yield event(shaper.chunk("", None, first=True))
        while True:
            update = await stream.get()
            if update.error:  # the stream's last event, before [DONE]
                done = True
                kind = ERROR_TYPES.get(update.status, "APIError")
                yield event(error_body(update.error, kind, update.status))
                break
            finished = update.finish_reason is not None
            text = visible_text(update.text, stops, finished)
            delta = ""
            if text.startswith(sent):  # a tokenizer may re-spell earlier text: never repeat it
                delta, sent = text[len(sent):], text
            # a chunk for every token, even one with no text yet (as vLLM streams completions)
            yield event(shaper.chunk(delta, update.finish_reason))
            if finished:
                done = True
                if include_usage:
                    yield event(shaper.usage_chunk(update))
                break
        yield event("[DONE]")
    finally:
        if not done:  # the client went away mid-stream: free its KV blocks
            log.info("request %s aborted: the client disconnected", request_id)
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
            return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage(update),
                    **self._kv(update)}
        choice = {"index": 0, "text": update.text, "logprobs": None, "finish_reason": update.finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": self.usage(update),
                **self._kv(update)}

    @staticmethod
    def _kv(update: Update) -> dict:
        """vLLM's top-level kv_transfer_params, only on a P/D answer (other bodies stay as they were)."""
        return {"kv_transfer_params": update.kv_transfer_params} if update.kv_transfer_params else {}

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
