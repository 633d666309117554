"""One simulated engine replica: the engine's own Scheduler and BlockManager, stepped in virtual time.

Each step's duration comes from the latency model. Between events (an arrival, a completion, a
prefill chunk, the step where KV blocks run out) the decode batch does not change, so the replica
runs the first step through the real scheduler and advances the identical steps after it at once
(simulator.fastforward); an arrival during such a stretch interrupts it at the next step boundary,
exactly where a step-by-step run would have admitted it.

Times are integer picoseconds (simulator.steptime). Lifecycle: provisioning -> ready -> draining ->
gone, or failed.
"""

from __future__ import annotations

import simpy

from engine.core.batch_shape import batch_shape
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler, length_left
from simulator.fastforward import advance_decodes, decode_stretch
from simulator.kvcount import CountingBlockManager
from simulator.kvtier import TieredBlockManager
from simulator.replica_metrics import LAYOUT, ReplicaMetrics
from simulator.requests import SimSequence
from simulator.steptime import PS, StepTimer, steps_reaching, sum_steps
from simulator.stretch_blocks import grown_blocks, take_grown_blocks

SAMPLED_TOKEN = 1  # synthetic output token; requests ignore EOS so output length = max_tokens


class Replica:
    def __init__(self, env: simpy.Environment, rid: int, pool, timer: StepTimer, fleet, fast: bool = True):
        spec = pool.spec
        self.env, self.id, self.pool, self.timer, self.fleet, self.fast = env, rid, pool, timer, fleet, fast
        if fast and not spec.prefix_caching:
            self.bm = CountingBlockManager(spec.num_kv_blocks(), spec.block_size)
        elif spec.kv_offload is not None:  # simulator.kvtier: evicted prefix blocks kept in host memory
            self.bm = TieredBlockManager(spec.num_kv_blocks(), spec.block_size, spec.kv_offload.blocks)
        else:  # the step-by-step reference always runs on the engine's own block manager
            self.bm = BlockManager(spec.num_kv_blocks(), spec.block_size, spec.prefix_caching)
        self.sched = Scheduler(self.bm, spec.max_num_seqs, spec.max_num_batched_tokens, spec.max_model_len,
                               enable_chunked_prefill=spec.chunked_prefill)
        self.metrics = ReplicaMetrics()
        self.state = "provisioning"
        self.created = env.now
        self.ready_at: int | None = None
        self.gone_at: int | None = None
        self.outstanding = 0
        self.reserved = 0  # P/D: KV reservations whose transfer is still on its way (simulator.pd)
        self.busy_ps = 0  # time spent stepping (utilisation)
        self.prefill_computed = 0  # prompt tokens computed (not found in any KV tier)
        self.load_ps = spec.kv_offload.load_ps_per_block if spec.kv_offload is not None else 0
        self.max_usage = 0.0
        self._wake: simpy.Event | None = None
        self._ff: tuple | None = None  # the stretch in progress: (t0, a, b, c0, num_seqs, steps, seqs)
        self._grow: tuple | None = None  # the same, kept after a cut until its blocks are taken
        self.wakeup_ps = int(round(spec.wakeup_ms * 1e9))
        self.proc: simpy.Process | None = None

    # -- what the router and the metrics see (ReplicaView) ---------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.sched.waiting)

    @property
    def num_running(self) -> int:
        return len(self.sched.running)

    @property
    def kv_usage(self) -> float:
        return self.bm.usage

    def kv_usage_now(self) -> float:
        """KV usage at this instant, counting blocks the running fast-forward has grown into."""
        if self._ff is None:  # (after a cut, what the stretch grew into is left out, as before P/D)
            return self.bm.usage
        return min(1.0, self.bm.usage + self.ff_extra_blocks() / self.bm.num_blocks)

    def ff_extra_blocks(self) -> int:
        """Blocks the running fast-forward has grown into by now, not yet taken from the manager."""
        return 0 if self._grow is None else grown_blocks(self.bm, self._grow, self.env.now)

    def catch_up(self) -> None:
        """Takes now the blocks the decode stretch in progress has grown into, for a P/D reservation
        or prefix lookup made from outside (simulator.pd)."""
        if self._grow is not None:
            take_grown_blocks(self.bm, self._grow, self.env.now)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, delay_ps: int) -> None:
        self.proc = self.env.process(self._life(delay_ps))

    def _life(self, delay_ps: int):
        try:
            yield self.env.timeout(delay_ps)
        except simpy.Interrupt:  # scaled away (or failed) while provisioning
            return
        self.state = "ready"
        self.ready_at = self.env.now
        self.fleet.on_ready(self)
        yield from self._serve()

    def submit(self, seq: SimSequence) -> None:
        self.sched.add(seq)
        self.outstanding += 1
        self.metrics.inc("arrivals")
        self.poke()

    def poke(self) -> None:
        """Something changed for the next step (an arrival, a P/D request or reservation): wake up,
        or cut the decode stretch in progress at the step in progress."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        else:
            self.cut_stretch()

    def cut_stretch(self) -> None:
        if self._ff is not None:
            self._ff = None  # one interrupt ends the stretch; later arrivals just queue
            self.proc.interrupt("arrival")

    def drain(self) -> None:
        """No new requests; in-flight ones finish, then the replica is gone."""
        if self.state == "provisioning":
            self.state = "gone"
            self.gone_at = self.env.now
            self.proc.interrupt("cancel")
            return
        self.state = "draining"
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def fail(self) -> list[SimSequence]:
        """Dies now; returns the requests it held (their progress is lost)."""
        was = self.state
        self.state = "failed"
        self.gone_at = self.env.now
        self._ff = self._grow = None
        seqs = list(self.sched.running) + list(self.sched.waiting)
        if self.proc is not None and self.proc.is_alive and self.proc is not self.env.active_process:
            self.proc.interrupt("fail" if was != "provisioning" else "cancel")
        return seqs

    # -- stepping ------------------------------------------------------------------------------
    def _serve(self):
        env, sched = self.env, self.sched
        while True:
            if not sched.has_unfinished():
                if self.state == "draining" and not self.reserved:  # a reserved P/D request is on its way
                    self.state = "gone"
                    self.gone_at = env.now
                    self.fleet.on_gone(self)
                    return
                if not (yield from self._idle()):
                    return
                continue
            try:
                if self.fast:
                    steps, finishes = decode_stretch(sched)
                    if steps:
                        yield from self._stretch(steps, finishes)
                        continue
                yield from self._step()
            except simpy.Interrupt:
                return  # failed mid-step: the fleet has taken the requests back
            u = self.bm.usage
            if u > self.max_usage:
                self.max_usage = u

    def _idle(self):
        self._wake = self.env.event()
        try:
            yield self._wake
            if self.wakeup_ps and self.sched.has_unfinished():  # arrivals meanwhile join the first step
                yield self.env.timeout(self.wakeup_ps)
        except simpy.Interrupt:
            return False  # failed while idle
        self._wake = None
        return True

    def _step(self):
        """One step through the real scheduler."""
        env, sched = self.env, self.sched
        t0 = env.now
        out = sched.schedule(t0)
        if out.preempted:
            self.metrics.inc("num_preemptions", len(out.preempted))
        if not out.seqs:
            if not out.preempted:  # nothing fits (cannot normally happen): wait for a change
                yield from self._idle()
            return  # the step only preempted: the next one admits again
        shape = batch_shape(out.seqs, out.num_new_tokens)
        sampled = []
        for seq, n in zip(out.seqs, out.num_new_tokens):
            if seq.first_cached < 0:  # just admitted for the first time: its prefix-cache hit
                seq.first_cached = seq.num_cached_tokens
            sampled.append(SAMPLED_TOKEN if seq.num_computed_tokens + n == len(seq) else None)
        ds = shape.decode_seqs
        a, b = self.timer.coeffs(shape.prefill_tokens, shape.prefill_context, ds, shape.prefill_seqs)
        d = a + b * shape.decode_context
        if self.load_ps:  # blocks admitted from the offload tier are copied in during this step
            d += self.bm.offload.take_loaded() * self.load_ps
        self.prefill_computed += shape.prefill_tokens
        yield env.timeout(d)
        t1 = t0 + d
        self.busy_ps += d
        if ds:
            self.metrics.observe("inter_token_latency_seconds", d / PS, ds)
        finished = sched.update(out, sampled, t1)
        self._after_update(out, sampled, finished, t1)

    def _stretch(self, steps: int, finishes: bool):
        """`steps` identical decode steps of the whole running batch, advanced in closed form; the
        last one finishes some requests when `finishes`. An arrival cuts the stretch at the end of
        the step in progress, where the stepwise run would have admitted it."""
        env = self.env
        seqs = list(self.sched.running)
        ds = len(seqs)
        dc = sum(s.num_computed_tokens for s in seqs) + ds
        a, b = self.timer.coeffs(0, 0, ds, 0)
        t0 = env.now
        self._ff = self._grow = (t0, a, b, dc, ds, steps, seqs)
        try:
            yield env.timeout(sum_steps(a, b, dc, ds, steps))
        except simpy.Interrupt as intr:
            if intr.cause != "arrival":
                raise
            reached = steps_reaching(a, b, dc, ds, env.now - t0)
            if reached < steps:
                steps, finishes = reached, False
            rest = t0 + sum_steps(a, b, dc, ds, steps) - env.now
            if rest > 0:
                yield env.timeout(rest)
        self._ff = self._grow = None
        advance_decodes(self.bm, seqs, steps, SAMPLED_TOKEN)
        # step j lasts a + b*(dc + ds*j): the inter-token time of each of the ds sequences
        self.metrics.observe_arithmetic(
            "inter_token_latency_seconds", (a + b * dc) / PS, b * ds / PS, steps, ds
        )
        self.metrics.inc("generation_tokens", ds * steps)
        self.busy_ps += sum_steps(a, b, dc, ds, steps)
        if finishes:
            # what update() does for a request whose last token this step sampled
            t1 = t0 + sum_steps(a, b, dc, ds, steps)
            sched, max_len = self.sched, self.sched.max_model_len
            done = [s for s in seqs if length_left(s, max_len) <= 0]
            for s in done:
                sched.finish(s, "length", t1)
            self._finished(done)

    def _after_update(self, out, sampled: list, finished: list[SimSequence], t1: int) -> None:
        m = self.metrics
        gen = 0
        for seq, token in zip(out.seqs, sampled):
            if token is not None:
                gen += 1
                if seq.first_token_time == t1 and seq.num_output_tokens == 1:
                    m.observe("time_to_first_token_seconds", (t1 - seq.arrival_time) / PS)
                    m.observe(
                        "request_queue_time_seconds", (seq.first_scheduled_time - seq.replica_arrival) / PS
                    )
                    m.inc("prompt_tokens", seq.num_prompt_tokens)
        m.inc("generation_tokens", gen)
        self._finished(finished)

    def _finished(self, finished: list[SimSequence]) -> None:
        m = self.metrics
        for seq in finished:
            self.outstanding -= 1
            e2e = (seq.finish_time - seq.arrival_time) / PS
            m.observe("e2e_request_latency_seconds", e2e)
            if seq.num_output_tokens > 1:
                m.observe(
                    "request_time_per_output_token_seconds",
                    (seq.finish_time - seq.first_token_time) / PS / (seq.num_output_tokens - 1),
                )
            m.inc("request_success")
            m.inc("request_prompt_tokens_sum", seq.num_prompt_tokens)
            m.inc("request_output_tokens_sum", seq.num_output_tokens)
            self.fleet.on_finish(self, seq)

    def scrape_vector(self):
        self.metrics.v[LAYOUT["prefix_cache_queries"]] = self.bm.prefix_cache_queries
        self.metrics.v[LAYOUT["prefix_cache_hits"]] = self.bm.prefix_cache_hits
        return self.metrics.cumulative()
