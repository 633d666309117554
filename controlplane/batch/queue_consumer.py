"""The async processor: requests from a Redis stream, sent through the router's batch band, each
result written to the Redis stream (or key) the request names.

    XADD requests * id req-1 url /v1/chat/completions body '{"model": ..., "messages": [...]}' \
        reply_to results [deadline 1767225600]
    ... later: XRANGE results - +   ->   id req-1  result '{"id": ..., "custom_id": "req-1",
                                          "response": {"status_code": 200, ...}, "error": null}'

Fields of a request: `id` (the caller's, echoed with the result: duplicates are detectable by it),
`body` (the JSON request), `url` (/v1/completions, the default, or /v1/chat/completions), `reply_to`
(a stream the result is added to) or `reply_key` (a key set to it, kept `result_ttl` seconds), and
`deadline` (Unix seconds; past it the request is answered `deadline_exceeded` unsent). The result is
a batch output line (controlplane.batch.lines), so one reader handles both.

Delivery: a consumer group (created at start), one consumer name per process. A request is
acknowledged (XACK) in the same MULTI/EXEC transaction that writes its result, so a process killed at
any point leaves it either unanswered and pending (read again at the next start: its own pending
entries first, and entries another consumer left idle past `claim_idle` are claimed) or answered
and acknowledged once. The request itself may then reach an engine twice (at-least-once execution).
Requests go to the router with `x-slopilot-priority` set to its batch band, so its gate holds them
under that band's saturation level, behind interactive traffic; a transient refusal (429, 503, a lost
connection) is retried with backoff until the request's deadline.

Another queue (a design note, not built): Google Pub/Sub fits the same loop with a pull
subscription: a message's ack deadline plays the part of the pending entry (extended while its
request runs, `modify_ack_deadline`), the result is published to the topic the message's attributes
name, and the ack follows the publish's confirmation; Pub/Sub offers no transaction across the two,
so a consumer killed between them leaves a duplicate result, detectable by the request's id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from controlplane.batch.lines import URLS, error_line, output_line

log = logging.getLogger("slopilot.async")
RETRY_STATUS = {429, 502, 503, 504}


class QueueConsumer:
    def __init__(self, redis_url: str, stream: str, router_url: str, group: str = "slopilot",
                 consumer: str = "consumer-0", priority: str = "0", max_inflight: int = 32,
                 claim_idle: float = 60.0, result_ttl: int = 86_400, api_key: str | None = None,
                 timeout: float = 600.0, engine_priority: int | None = None):
        self.redis = aioredis.from_url(redis_url, decode_responses=True)
        self.stream, self.group, self.consumer, self.router = stream, group, consumer, router_url.rstrip("/")
        self.priority, self.max_inflight, self.claim_idle = priority, max_inflight, claim_idle
        self.result_ttl, self.engine_priority = result_ttl, engine_priority
        headers = {"x-slopilot-priority": priority}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.http = httpx.AsyncClient(headers=headers, timeout=timeout, trust_env=False)
        self.inflight: dict[str, asyncio.Task] = {}
        self.answered = 0

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        backlog = True  # first this consumer's own pending entries (delivered before a restart)
        next_claim = 0.0
        try:
            while not stop.is_set():
                room = self.max_inflight - len(self.inflight)
                if room <= 0:
                    await asyncio.wait(list(self.inflight.values()), return_when=asyncio.FIRST_COMPLETED)
                    continue
                entries = []
                if time.monotonic() >= next_claim:
                    next_claim = time.monotonic() + max(1.0, self.claim_idle / 4)
                    claimed = await self.redis.xautoclaim(self.stream, self.group, self.consumer,
                                                          int(self.claim_idle * 1000), "0-0", count=room)
                    entries = [e for e in claimed[1] if e[0] not in self.inflight]
                if not entries:
                    got = await self.redis.xreadgroup(self.group, self.consumer, {self.stream: "0" if backlog
                                                      else ">"}, count=room, block=None if backlog else 500)
                    entries = [e for e in (got[0][1] if got else []) if e[0] not in self.inflight]
                    if backlog and not entries:
                        backlog = False
                        continue
                for entry_id, fields in entries:
                    if fields is None:  # deleted from the stream while pending: nothing to answer
                        await self.redis.xack(self.stream, self.group, entry_id)
                        continue
                    task = asyncio.create_task(self.handle(entry_id, fields))
                    self.inflight[entry_id] = task
                    task.add_done_callback(lambda t, e=entry_id: self.inflight.pop(e, None))
                if backlog and entries:
                    await asyncio.wait(list(self.inflight.values()))  # the pending list read from "0" again
        finally:
            for t in self.inflight.values():
                t.cancel()
            await asyncio.gather(*self.inflight.values(), return_exceptions=True)
            await self.http.aclose()
            await self.redis.aclose()

    async def handle(self, entry_id: str, fields: dict[str, str]) -> None:
        rid = fields.get("id") or entry_id
        reply_to, reply_key = fields.get("reply_to"), fields.get("reply_key")
        try:
            result = await self.answer(rid, fields)
        except Exception as exc:  # a bug or a broken request: answered, not retried for ever
            log.exception("request %s", rid)
            result = error_line(rid, "internal_error", f"the async processor failed: {exc}")
        async with self.redis.pipeline(transaction=True) as tx:  # the result and the ack together
            if reply_to:
                tx.xadd(reply_to, {"id": rid, "result": result})
            elif reply_key:
                tx.set(reply_key, result, ex=self.result_ttl)
            tx.xack(self.stream, self.group, entry_id)
            await tx.execute()
        self.answered += 1

    async def answer(self, rid: str, fields: dict[str, str]) -> str:
        """The request's output line: the router's answer, or an error line with the reason."""
        if not fields.get("reply_to") and not fields.get("reply_key"):
            return error_line(rid, "invalid_request", "the request names neither reply_to nor reply_key")
        url = fields.get("url") or URLS[0]
        if url not in URLS:
            return error_line(rid, "invalid_request", f"url must be one of {', '.join(URLS)}, got {url!r}")
        try:
            body = json.loads(fields.get("body") or "")
            deadline = float(fields.get("deadline") or "inf")
        except ValueError as exc:
            return error_line(rid, "invalid_request", f"body must be a JSON object, deadline a number: {exc}")
        if not isinstance(body, dict):
            return error_line(rid, "invalid_request", "body must be a JSON object")
        if self.engine_priority is not None:
            body.setdefault("priority", self.engine_priority)  # the engine's background class
        for attempt in range(1_000_000):
            if time.time() >= deadline:
                return error_line(rid, "deadline_exceeded", "the request's deadline passed before it was "
                                                            "answered")
            if attempt:
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(attempt, 6), max(0.0, deadline - time.time())))
            try:
                r = await self.http.post(self.router + url, json=body)
            except httpx.TransportError as exc:
                log.warning("request %s: %s (retried)", rid, exc)
                continue
            if r.status_code in RETRY_STATUS:
                continue
            try:
                answer = r.json()
            except ValueError:
                answer = r.text
            return output_line(rid, r.status_code, r.headers.get("x-request-id") or f"req_{rid}", answer)
        raise AssertionError("unreachable")
