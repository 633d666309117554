"""LLMEngine in a thread of its own, fed by a command queue, streaming to asyncio queues.

LLMEngine is not thread-safe, so only the engine thread touches it: the event loop puts adds and
aborts on a queue.SimpleQueue, and the engine thread hands each step's results back with
loop.call_soon_threadsafe. The event loop never waits on a step.

A request that fails inside a step (LLMEngine finishes it with reason "error") ends with an error
update of its own; only an exception out of the loop itself ends the engine: every stream then gets
the error, `alive` turns false and the on_death callbacks run (serve() exits the process).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.llm_engine import LLMEngine
from engine.metrics import EngineMetrics

log = logging.getLogger("slopilot.engine")


@dataclass
class Update:
    """A request's state after a step: its whole text so far (stop strings cut) and token counts."""
    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None  # set on the last update
    error: str | None = None
    status: int = 500  # with an error: 400 refused, 500 failed alone, 503 engine dead or shutting down
    kv_transfer_params: dict | None = None  # a producer's answer to do_remote_decode (engine.kv_transfer)


def error_update(message: str, status: int, num_prompt_tokens: int = 0) -> Update:
    return Update("", num_prompt_tokens, 0, "error", message, status)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: EngineMetrics):
        self.engine = engine
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.streams: dict[str, asyncio.Queue[Update]] = {}  # only touched on the event loop
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: str | None = None  # set when the engine loop died
        self.closed: str | None = None  # set by close(): why no more requests are taken
        self.on_death: list[Callable[[], None]] = []  # run on the event loop when the loop dies
        self.num_submitted = 0  # adds put on the queue (event loop)
        self.num_admitted = 0  # adds the engine thread has taken (engine thread)
        self.num_waiting = 0  # the scheduler's waiting queue after the last step
        self.kv = None  # an engine.kv_transfer KVConnector when the engine has a P/D role

    def set_kv_transfer(self, cfg, model_name: str) -> None:
        from engine.kv_transfer.connector import KVConnector
        from engine.kv_transfer.metrics import KVTransferMetrics

        self.kv = KVConnector(cfg, self.engine, lambda: self._commands.put(("kv",)))
        self.kv_metrics = KVTransferMetrics(self.metrics.registry, model_name, 0, cfg.kv_role)

    # -- event-loop side -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Requests waiting for the engine: in its waiting queue or not yet taken off the command queue."""
        return self.num_waiting + self.num_submitted - self.num_admitted

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams, arrival: float,
            priority: int = 0, kv_transfer_params: dict | None = None) -> asyncio.Queue[Update]:
        """A queue of the request's updates; the caller checks `alive` and `closed` first."""
        stream: asyncio.Queue[Update] = asyncio.Queue()
        self.streams[request_id] = stream
        self.num_submitted += 1
        self._commands.put(("add", request_id, prompt_ids, params, arrival, priority, kv_transfer_params))
        return stream

    def abort(self, request_id: str) -> None:
        """Called when a client went away: frees the request's blocks at the next step boundary."""
        if self.streams.pop(request_id, None) is not None:
            self._commands.put(("abort", request_id))

    def _deliver(self, updates: list[tuple[str, Update]]) -> None:
        for request_id, update in updates:
            stream = self.streams.get(request_id)
            if stream is None:
                continue
            if update.finish_reason is not None:
                del self.streams[request_id]
            stream.put_nowait(update)

    def close(self, message: str) -> int:
        """Ends every request still running with a 503 error and takes no more; how many it ended."""
        self.closed = message
        ended = list(self.streams)
        self._fail_all(message)
        for request_id in ended:
            self._commands.put(("abort", request_id))
        return len(ended)

    def _fail_all(self, message: str) -> None:
        for stream in self.streams.values():
            stream.put_nowait(error_update(message, 503))
        self.streams.clear()

    def _died(self) -> None:
        self._fail_all(self.error)
        for callback in self.on_death:
            callback()

    # -- engine-thread side ----------------------------------------------------------------------
    def _send(self, request_id: str, update: Update) -> None:
        self._loop.call_soon_threadsafe(self._deliver, [(request_id, update)])

    def _run(self) -> None:
        try:
            while True:
                block = not self.engine.has_unfinished()
                if block and hasattr(self.engine.runner, "idle"):  # the emulated runner's pacing
                    self.engine.runner.idle()
                if not self._handle_commands(block):
                    return
                if self.kv is not None:
                    self._kv_tick()
                if self.engine.has_unfinished():
                    self._step()
        except Exception as exc:  # the engine is dead: /health turns 503, every stream gets the error
            log.exception("engine loop died")
            self.error = f"engine loop died: {type(exc).__name__}: {exc}"
            self._loop.call_soon_threadsafe(self._died)

    def _handle_commands(self, block: bool) -> bool:
        """Applies queued adds/aborts; waits for one when idle. False on stop."""
        while True:
            try:
                cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return True
            block = False
            if cmd[0] == "stop":
                return False
            if cmd[0] == "add":
                self._add(*cmd[1:])
            elif cmd[0] == "kv":
                pass  # a pull came back or a lease was confirmed: _run ticks the connector
            else:
                self._abort(cmd[1])

    def _add(self, request_id: str, prompt_ids: list[int], params: SamplingParams, arrival: float,
             priority: int, kv_transfer_params: dict | None = None) -> None:
        self.num_admitted += 1
        try:
            if self.kv is not None and self.kv.on_add(request_id, prompt_ids, kv_transfer_params,
                                                      (prompt_ids, params, request_id, arrival, priority)):
                self.metrics.update_gauges(self.engine)  # its landing blocks count in the KV usage now
                return  # queued when its KV blocks are in (_kv_tick)
            if kv_transfer_params and self.kv is None and (kv_transfer_params.get("do_remote_decode")
                                                           or kv_transfer_params.get("do_remote_prefill")):
                raise ValueError("kv_transfer_params given, but this engine has no --kv-transfer-config")
            self.engine.add_request(prompt_ids, params, request_id, arrival, priority)
        except ValueError as exc:  # the server checks lengths first; this is the last guard
            if self.kv is not None:
                self.kv.abort(request_id)  # forget a lease it was marked for
            self._send(request_id, error_update(str(exc), 400, len(prompt_ids)))
            return
        self.num_waiting = len(self.engine.scheduler.waiting)

    def _kv_tick(self) -> None:
        """Ends confirmed and expired leases; queues the requests whose KV blocks came in."""
        freed, pulls = self.kv.tick()
        if not freed and not pulls:
            return
        for pull, error in pulls:
            try:
                if error is not None:
                    raise ValueError(error)
                self.engine.add_request(*pull.args)
            except ValueError as exc:
                self._send(pull.request_id, error_update(str(exc), 400, len(pull.args[0])))
        self.metrics.update_gauges(self.engine)
        self.kv_metrics.sync(self.kv)
        self.num_waiting = len(self.engine.scheduler.waiting)

    def _abort(self, request_id: str) -> None:
        if self.kv is not None and self.kv.abort(request_id):
            return  # a pull in flight: its blocks are dropped when it ends
        seq = self.engine.seqs.get(request_id)
        if seq is None:
            return
        if self.engine.abort(request_id):
            self.metrics.record_finished(seq)
        self.engine.pop_output(request_id)
        self.metrics.update_gauges(self.engine)
        self.num_waiting = len(self.engine.scheduler.waiting)

    def _step(self) -> None:
        advanced = self.engine.step()
        # a request that failed in the step got no token in it
        tokens = [seq for seq in advanced if seq.finish_reason != "error"]
        self.metrics.record_step(self.engine, tokens, self.engine.clock())
        self.num_waiting = len(self.engine.scheduler.waiting)
        updates = []
        for seq in advanced:
            if seq.is_finished:  # metrics first: a client that got its answer may scrape at once
                self.metrics.record_finished(seq)
            update = self._update(seq)
            if seq.is_finished and self.kv is not None:
                update.kv_transfer_params = self.kv.on_finished(seq)
                if update.kv_transfer_params:  # leased blocks stay in vllm:kv_cache_usage_perc
                    self.metrics.update_gauges(self.engine)
                    self.kv_metrics.sync(self.kv)
            updates.append((seq.request_id, update))
            if seq.is_finished:
                self.engine.pop_output(seq.request_id)
        if updates:  # one wake-up of the event loop a step, not one a request
            self._loop.call_soon_threadsafe(self._deliver, updates)

    def _update(self, seq: Sequence) -> Update:
        if seq.finish_reason == "error":
            return error_update(seq.error or "the request failed in the engine", 500, seq.num_prompt_tokens)
        return Update(self.engine.output_text(seq), seq.num_prompt_tokens, seq.num_output_tokens,
                      seq.finish_reason if seq.is_finished else None)
