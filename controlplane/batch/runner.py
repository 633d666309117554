"""The batch dispatcher: pending lines, earliest deadline first, through the gateway's batch band.

Each line is one gated request at the batch band's priority (the band named `batch`, else the lowest
one): the gate holds it until an endpoint is under that band's saturation level and serves every
higher band first, so interactive requests are never held behind batch lines. At most `max_inflight`
lines are out at a time (held in the gate or at an engine). A line answered is written to the store
(its output line and its batch's counts, one transaction a round of the loop) before it counts as
done; a line not written when the process dies is pending again after restart, so the output file
has every line once (an engine may have computed it twice).

With `engine_priority` set, a line whose body has no `priority` is sent with that one (vLLM's
request field: lower is served first), so an engine run with `--scheduling-policy priority
--background-priority` lets it run only in steps no interactive request needs.

A transient refusal (band full, TTL in the gate, no endpoint could take it, an engine's 429) sends
the line again later with backoff; a model no endpoint serves (404) and an engine's answer (2xx or
4xx) are final. At expiry (or cancellation) the lines still waiting in the gate are withdrawn, those
at an engine finish, and the rest are answered `batch_expired` (`batch_cancelled`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.batch import lifecycle
from controlplane.batch.lines import output_line
from controlplane.batch.metrics import BatchMetrics
from controlplane.batch.store import CANCELLED, COMPLETED, EXPIRED, FAILED, Store
from controlplane.router.gate import Gate, Pending, Refused
from controlplane.router.prompt import PromptReader, request_prompt
from controlplane.router.proxy import error_body, forward

log = logging.getLogger("slopilot.router.batch")

RETRY_STATUS = {429, 502, 503, 504}  # an engine's overload or a lost answer: the line goes again
MAX_SERVER_ERRORS = 3  # a line an engine answers 500 this often gets that answer


@dataclass
class Line:
    task: asyncio.Task | None = None
    sending: bool = False  # past the gate: at an engine (finishes even if its batch closes)


class Capture:
    """Stands in for the client connection in proxy.forward: keeps the engine's whole answer."""

    closed = False

    def __init__(self):
        self.status, self.headers, self.body = 0, [], b""

    def respond(self, status: int, headers, body: bytes, head_only: bool = False) -> None:
        self.status, self.headers, self.body = status, headers, body


class BatchRunner:
    def __init__(self, store: Store, gate: Gate, reader: PromptReader, upstream: Callable, headers: bytes,
                 metrics: BatchMetrics, max_inflight: int = 64, tick: float = 0.1,
                 engine_priority: int | None = None):
        self.store, self.gate, self.reader, self.upstream = store, gate, reader, upstream
        self.headers, self.metrics, self.max_inflight, self.tick = headers, metrics, max_inflight, tick
        self.engine_priority = engine_priority
        band = next((b for b in gate.queue.bands if b.name == "batch"), gate.queue.bands[-1])
        self.priority = band.priority
        self.inflight: dict[tuple[str, int], Line] = {}
        self.results: list[tuple] = []  # answered, not yet written
        self.busy: set[str] = set()  # batches a worker thread is validating or finalizing
        self.closing: dict[str, int] = {}  # batch -> EXPIRED or CANCELLED
        self._wake = asyncio.Event()
        self._jobs: set[asyncio.Task] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        house = 0.0
        try:
            while not stop.is_set():
                self.flush()
                if time.monotonic() >= house:
                    self.housekeeping()
                    house = time.monotonic() + self.tick
                self.fill()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.tick)
                except TimeoutError:
                    pass
                self._wake.clear()
        finally:
            tasks = [line.task for line in self.inflight.values() if line.task is not None]
            for t in tasks + list(self._jobs):
                t.cancel()
            await asyncio.gather(*tasks, *self._jobs, return_exceptions=True)
            self.flush()  # what was answered is kept; the rest is pending at the next start

    # -- batches ---------------------------------------------------------------------------------
    def housekeeping(self) -> None:
        now = time.time()
        for doc in self.store.batches_in("validating", "in_progress", "cancelling", "finalizing"):
            bid, status = doc["id"], doc["status"]
            if bid in self.busy:
                continue
            if status == "validating":
                self._job(bid, lifecycle.validate, self.store, doc, self.reader)
            elif status == "finalizing":
                self._job(bid, lifecycle.finalize, self.store, bid, "completed")
            elif status == "cancelling" or now >= doc["expires_at"] or bid in self.closing:
                self.close(bid, CANCELLED if status == "cancelling" else EXPIRED)
            else:
                rc = doc["request_counts"]
                if rc["completed"] + rc["failed"] >= rc["total"] and not self._out(bid):
                    lifecycle.finalizing(self.store, bid)
                    self._job(bid, lifecycle.finalize, self.store, bid, "completed")

    def close(self, bid: str, state: int) -> None:
        """Withdraws the batch's lines from the gate; once none is out, closes the rest and finalizes."""
        self.closing[bid] = state
        out = self._out(bid)
        for line in out:
            if not line.sending and line.task is not None:
                line.task.cancel()
        if out:
            return

        def closed(n: int) -> None:
            self.metrics.outcome(state, n)
            self.closing.pop(bid, None)
        self._job(bid, lifecycle.close_and_finalize, self.store, bid, state, after=closed)

    def _out(self, bid: str) -> list[Line]:
        return [line for (b, _), line in self.inflight.items() if b == bid]

    def _job(self, bid: str, fn, *args, after=None) -> None:
        """fn(*args) in a worker thread, the batch marked busy meanwhile; then after(its result)."""
        async def job():
            try:
                result = await asyncio.to_thread(fn, *args)
                if after is not None:
                    after(result)
            except Exception:
                log.exception("batch %s: %s failed (retried)", bid, fn.__name__)
                await asyncio.sleep(1.0)
            finally:
                self.busy.discard(bid)
                self.wake()
        self.busy.add(bid)
        task = asyncio.get_running_loop().create_task(job())
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    # -- lines -----------------------------------------------------------------------------------
    def fill(self) -> None:
        room = self.max_inflight - len(self.inflight)
        if room < max(1, self.max_inflight // 8) and self.inflight:
            return  # refill in groups: one query for several lines
        for bid, n, cid, url, body in self.store.next_pending(room + len(self.inflight)):
            key = (bid, n)
            if room <= 0:
                break
            if key in self.inflight or bid in self.closing:
                continue
            line = self.inflight[key] = Line()
            line.task = asyncio.get_running_loop().create_task(self._line(key, cid, url, body, line))
            room -= 1

    async def _line(self, key: tuple[str, int], cid: str, url: str, body: str, line: Line) -> None:
        try:
            state, text, usage = await self._send(cid, body, url, line)
        except asyncio.CancelledError:
            self.inflight.pop(key, None)  # withdrawn: still pending
            return
        except Exception:
            log.exception("batch line %s:%d failed unexpectedly (sent again later)", *key)
            await asyncio.sleep(1.0)
            self.inflight.pop(key, None)
            return
        self.results.append((*key, state, text, usage))
        self.wake()

    async def _send(self, cid: str, body: str, path: str, line: Line) -> tuple[int, str, tuple]:
        data = json.loads(body)
        model = str(data.get("model") or "")
        hashes, tokens = self.reader.read(request_prompt(data, path == "/v1/chat/completions"))
        if self.engine_priority is not None and "priority" not in data:
            data["priority"] = self.engine_priority
            body = json.dumps(data)
        raw = body.encode()
        self.gate.metrics.arrived(model, self.priority)
        self.gate.metrics.tokens(self.priority, tokens,
                                 data.get("max_completion_tokens", data.get("max_tokens")))
        server_errors = 0
        for attempt in itertools.count():
            if attempt:
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(attempt, 6)))
            p = Pending(hashes, tokens, None, self.priority, model, time.monotonic())
            try:
                await self.gate.acquire(p)
            except Refused as exc:
                if exc.status == 404:
                    answer = error_body(str(exc), exc.kind, 404)
                    return FAILED, output_line(cid, 404, _rid([]), answer), (model, 0, 0)
                continue
            line.sending = True
            cap = Capture()
            try:
                await forward(self.gate, self.upstream(), p, path, raw, self.headers, False, cap)
            except Refused:
                continue
            finally:
                line.sending = False
            status = cap.status
            server_errors += status >= 500
            if status in RETRY_STATUS or (status >= 500 and server_errors < MAX_SERVER_ERRORS):
                continue
            try:
                answer = json.loads(cap.body)
            except ValueError:
                answer = cap.body.decode("utf-8", "replace")
            usage = answer.get("usage") if isinstance(answer, dict) and 200 <= status < 300 else None
            usage = usage if isinstance(usage, dict) else {}
            state = COMPLETED if 200 <= status < 300 else FAILED
            return state, output_line(cid, status, _rid(cap.headers), answer), \
                (model, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        raise AssertionError("unreachable")

    def flush(self) -> None:
        """Writes the answered lines and their batches' counts (one transaction); then they are done."""
        if not self.results:
            return
        results, self.results = self.results, []
        written: list[tuple] = []

        def counts(c, done: list[tuple]) -> None:
            per: dict[str, list[int]] = {}
            for bid, _, state, _, usage in done:
                acc = per.setdefault(bid, [0, 0, 0, 0])
                acc[0 if state == COMPLETED else 1] += 1
                acc[2] += usage[1]
                acc[3] += usage[2]
            for bid, acc in per.items():
                self.store.update_batch(bid, lambda d, a=acc: _add(d, a), c)
            written.extend(done)

        try:
            self.store.record(results, counts)
        except Exception:  # the disk, most likely: kept, and written at the next round
            log.exception("writing %d batch results failed (retried)", len(results))
            self.results = results + self.results
            return
        for r in results:
            self.inflight.pop((r[0], r[1]), None)
        self.metrics.answered(written)


def _add(doc: dict, acc: list[int]) -> None:
    rc = doc["request_counts"]
    rc["completed"] += acc[0]
    rc["failed"] += acc[1]
    u = doc.get("usage") or {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 0}
    u["input_tokens"] += acc[2]
    u["output_tokens"] += acc[3]
    u["total_tokens"] += acc[2] + acc[3]
    doc["usage"] = u


def _rid(headers: list[tuple[bytes, bytes]]) -> str:
    rid = next((v.decode("latin-1") for k, v in headers if k == b"x-request-id"), None)
    return rid or f"req_{uuid.uuid4().hex}"
