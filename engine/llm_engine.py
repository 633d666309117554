"""The engine loop: scheduler + model runner, one step at a time.

LLM.generate drives it offline; the OpenAI server drives it from its own thread. Requests are
added and aborted between steps; step() returns the requests that advanced.

A step whose batch raises is run again one request at a time: a request that fails alone is
finished with reason "error" (its message in seq.error) and the others go on. Only when
MAX_FAILED_ALONE requests in a row fail alone, with no success between, is the runner itself taken
to be broken: step() raises, and the caller's loop ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.args import EngineArgs
from engine.core.background import BackgroundFill
from engine.core.batch_shape import BatchShape, batch_shape
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import RequestRejected, Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.outputs import RequestMetrics, RequestOutput

MAX_FAILED_ALONE = 3


def background_fill(args: EngineArgs, runner) -> BackgroundFill | None:
    """The bounds on background work in a step, timed by the runner's step-time model."""
    if args.background_step_budget is None and args.background_solo_step is None:
        return None
    latency = getattr(runner, "latency", None)
    if latency is None:
        raise ValueError("--background-step-budget and --background-solo-step need a step-time model to "
                         "predict a step's time; only an emulated engine (serve --emulate) has one")

    def step_ms(b: BatchShape) -> float:
        return latency.step_ms(b.prefill_tokens, b.prefill_context, b.decode_seqs, b.decode_context,
                               b.prefill_seqs)

    return BackgroundFill(step_ms, args.background_step_budget, args.background_solo_step)


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, *, runner=None,
                 clock: Callable[[], float] = time.perf_counter):
        """runner: anything with ModelRunner's interface (execute, release, tokenizer, max_model_len,
        num_kv_blocks, block_size, eos_token_ids); the emulated server passes one that sleeps instead
        of computing, and its pool size wins over args'."""
        args = args or EngineArgs()
        if runner is None:
            from engine.model import resolve_config
            from engine.model_runner import ModelRunner

            config = resolve_config(args.model)
            positions = config.max_position_embeddings
            model_len = min(positions, args.max_model_len or positions)
            runner = ModelRunner(args.model, num_kv_blocks=args.kv_blocks(model_len),
                                 block_size=args.block_size, device=args.device, dtype=args.dtype,
                                 attention_backend=args.attention_backend, seed=args.seed)
            eos = list(config.eos_token_ids)
        else:
            model_len = min(runner.max_model_len, args.max_model_len or runner.max_model_len)
            eos = list(runner.eos_token_ids)
        self.args = args
        self.runner = runner
        self.tokenizer = self.runner.tokenizer
        self.block_manager = BlockManager(runner.num_kv_blocks, runner.block_size, args.enable_prefix_caching)
        if args.kv_offloading_size is not None:
            from engine.kv_offload import build_tier

            self.block_manager.offload = build_tier(args.kv_offloading_size, runner)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=args.max_num_seqs,
                                   max_num_batched_tokens=args.max_num_batched_tokens,
                                   max_model_len=min(model_len, self.runner.max_model_len),
                                   eos_token_id=eos,
                                   policy=args.scheduling_policy,
                                   enable_chunked_prefill=args.enable_chunked_prefill,
                                   background_priority=args.background_priority,
                                   background_fill=background_fill(args, self.runner))
        self.model_name = args.model
        self.clock = clock
        self.seqs: dict[str, Sequence] = {}
        self.prompts: dict[str, str | None] = {}
        # set to a list to record (shape, seconds) of every step, scheduling and bookkeeping included
        # (`slopilot profile --from-run` calibrates the simulator on these)
        self.step_log: list[tuple[BatchShape, float]] | None = None
        self.failed_alone = 0  # requests that failed alone since the runner last succeeded
        self.kv_events = None  # an engine.kv_events.KVEvents: one batch of KV events a step

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    priority: int = 0) -> Sequence:
        """Queues a request; raises RequestRejected when it can never be served."""
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        now = self.clock() if arrival_time is None else arrival_time
        seq = Sequence(token_ids, params or SamplingParams(), request_id, now, priority)
        if seq.request_id in self.seqs:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        self.scheduler.add(seq)
        self.seqs[seq.request_id] = seq
        self.prompts[seq.request_id] = prompt if isinstance(prompt, str) else None
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Sequence]:
        """Runs one batch; returns the sequences that got a token or finished in it."""
        started = self.clock()
        out = self.scheduler.schedule(started)
        if not out.seqs:
            return []
        shape = batch_shape(out.seqs, out.num_new_tokens) if self.step_log is not None else None
        sampled, failed = self._execute(out.seqs, out.num_new_tokens)
        now = self.clock()
        for seq, error in failed:
            self.scheduler.finish(seq, "error", now)
            seq.error = error
        finished = self.scheduler.update(out, sampled, now) + [seq for seq, _ in failed]
        advanced = [s for s, t in zip(out.seqs, sampled) if t is not None] + [seq for seq, _ in failed]
        for seq in advanced:
            if not seq.is_finished and seq.sampling_params.stop and self._hit_stop_string(seq):
                self.scheduler.finish(seq, "stop", now)
                finished.append(seq)
        for seq in finished:
            self.runner.release(seq.request_id)
        if shape is not None:
            self.step_log.append((shape, self.clock() - started))
        if self.kv_events is not None:
            self.kv_events.flush()
        return advanced

    def _execute(self, seqs: list[Sequence], num_new_tokens: list[int]
                 ) -> tuple[list[int | None], list[tuple[Sequence, str]]]:
        """The runner's tokens, and (seq, error) for each request that failed alone."""
        if len(seqs) > 1:
            try:
                sampled = self.runner.execute(seqs, num_new_tokens)
                self.failed_alone = 0
                return sampled, []
            except Exception:
                pass  # which request? each runs again alone (its KV slots are simply rewritten)
        sampled, failed = [], []
        for seq, n in zip(seqs, num_new_tokens):
            try:
                sampled.append(self.runner.execute([seq], [n])[0])
                self.failed_alone = 0
            except Exception as exc:
                self.failed_alone += 1
                if self.failed_alone >= MAX_FAILED_ALONE:
                    raise
                sampled.append(None)
                failed.append((seq, f"the request failed in the engine: {type(exc).__name__}: {exc}"))
        return sampled, failed

    def _hit_stop_string(self, seq: Sequence) -> bool:
        text = self.tokenizer.decode(seq.output_token_ids)
        return any(s in text for s in seq.sampling_params.stop)

    def abort(self, request_id: str) -> bool:
        done = self.scheduler.abort(request_id, self.clock())
        if done:
            self.runner.release(request_id)
        return done

    def output_text(self, seq: Sequence) -> str:
        text = self.tokenizer.decode(seq.output_token_ids)
        for stop in seq.sampling_params.stop:  # like vLLM, the stop string itself is not returned
            cut = text.find(stop)
            if cut != -1:
                text = text[:cut]
        return text

    def pop_output(self, request_id: str) -> RequestOutput:
        """The finished (or current) state of a request; forgets it once finished."""
        seq = self.seqs[request_id]
        output = make_output(seq, self.prompts.get(request_id), self.output_text(seq))
        if seq.status == SequenceStatus.FINISHED:
            del self.seqs[request_id], self.prompts[request_id]
        return output


def make_output(seq: Sequence, prompt: str | None, text: str, error: str | None = None) -> RequestOutput:
    metrics = RequestMetrics(seq.arrival_time, seq.first_scheduled_time, seq.first_token_time,
                             seq.finish_time)
    return RequestOutput(seq.request_id, prompt, seq.token_ids[:seq.num_prompt_tokens], text,
                         seq.output_token_ids, seq.finish_reason, metrics, seq.num_cached_tokens,
                         seq.num_preemptions, error or seq.error)


__all__ = ["LLMEngine", "RequestRejected", "make_output"]
