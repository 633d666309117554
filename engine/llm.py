"""Offline API shaped like vLLM's: LLM(model=...).generate(prompts, sampling_params)."""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import asdict

from engine.args import EngineArgs
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import RequestRejected
from engine.core.sequence import Sequence
from engine.llm_engine import LLMEngine, make_output
from engine.outputs import RequestOutput


class LLM:
    def __init__(self, model: str = "tiny", **engine_args):
        """engine_args: EngineArgs' fields (max_num_seqs, num_kv_blocks, device, ...)."""
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLM:
        return cls(**asdict(args))

    def generate(self, prompts: str | list[int] | Seq[str | list[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 arrival_times: Seq[float] | None = None, progress: bool = False) -> list[RequestOutput]:
        """Generates for every prompt; outputs come back in input order.

        arrival_times (seconds from the call, ascending per prompt) replays an arrival process in
        wall time: each request is added once its time has come, as a server would see it.
        A request that can never fit gets an output with finish_reason "error" and the reason.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = list(params) if isinstance(params, Seq) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
        if arrival_times is not None and len(arrival_times) != len(prompts):
            raise ValueError(f"got {len(arrival_times)} arrival times for {len(prompts)} prompts")
        engine = self.engine
        start = engine.clock()
        order = sorted(range(len(prompts)), key=lambda i: arrival_times[i]) if arrival_times else \
            list(range(len(prompts)))
        ids: list[str] = [""] * len(prompts)
        rejected: dict[int, RequestOutput] = {}
        pending = list(reversed(order))
        bar = _progress(progress, len(prompts))
        while pending or engine.has_unfinished():
            now = engine.clock()
            while pending and (arrival_times is None or start + arrival_times[pending[-1]] <= now):
                i = pending.pop()
                ids[i] = self._add(i, prompts[i], params_list[i], rejected,
                                   None if arrival_times is None else start + arrival_times[i])
            if engine.has_unfinished():
                before = len(engine.scheduler.waiting) + len(engine.scheduler.running)
                engine.step()
                if bar is not None:
                    bar.advance(before - len(engine.scheduler.waiting) - len(engine.scheduler.running))
            elif pending:  # idle until the next arrival
                time.sleep(max(0.0, start + arrival_times[pending[-1]] - engine.clock()))
        if bar is not None:
            bar.stop()
        return [rejected[i] if i in rejected else engine.pop_output(ids[i]) for i in range(len(prompts))]

    def _add(self, i: int, prompt, params: SamplingParams, rejected: dict, arrival: float | None) -> str:
        request_id = f"gen-{self._next_id}"
        self._next_id += 1
        try:
            self.engine.add_request(prompt, params, request_id, arrival)
        except RequestRejected as exc:
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            seq = Sequence(ids, params, request_id, arrival or self.engine.clock())
            seq.finish_reason, seq.error = "error", str(exc)
            rejected[i] = make_output(seq, prompt if isinstance(prompt, str) else None, "")
        return request_id


def _progress(enabled: bool, total: int):
    if not enabled:
        return None
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("generating", total=total)
    bar.start()

    class _Bar:
        def advance(self, n: int) -> None:
            if n > 0:
                bar.advance(task, n)

        def stop(self) -> None:
            bar.stop()

    return _Bar()
