"""A disaggregated service in the simulated fleet: prefill pool -> KV transfer -> decode pool.

The flow follows the live one (vLLM's P/D protocol behind llm-d's P/D profile):

1. The router looks at the decode pool: if the prompt's uncached tokens (its longest prefix-cache hit
   on any ready decode replica) are at most the threshold, the whole request goes to a decode replica.
2. Otherwise a prefill replica computes the prompt as a `max_tokens: 1` request (its own scheduler,
   batching, chunking and prefix cache; its metrics are the prefill role's).
3. Decode-side admission, first come first served: a ready decode replica with a free sequence slot
   and free KV blocks for the prompt beyond its cached prefix shares that prefix and reserves the
   rest (counted in its KV usage from then on); when none has room the prefilled request waits, and
   that wait is measured.
4. The KV the decode replica lacks moves: link latency + those tokens x KV bytes per token /
   bandwidth (no contention between transfers), plus the decode pool's front end when it models one
   (the decode hop is an HTTP request too). The request then joins the decode replica's running
   batch with the prompt tokens the connector loads computed (`loads`: all but the last, as vLLM's
   NixlConnector, or whole blocks, as its ExampleConnector), so its first step computes the rest and
   samples the first output token. TTFT = prefill queue + prefill + admission wait + transfer + that
   first decode step.

The producer holds the prompt's KV blocks from the end of its hop until the transfer ends (through
any decode admission wait). Simplification, stated: failures are not modelled for P/D pools (the
scenario refuses them). The fast path
stays on: a decode replica first takes the blocks its stretch in progress has grown into
(Replica.catch_up), so lookups and reservations see this instant's cache, and a reservation cuts the
stretch at the step in progress, as an arrival does (tests/simulator/test_sim_pd.py proves per-request timings
equal to the step-by-step run).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engine.core.sequence import SequenceStatus
from simulator.pd_spec import PDSpec
from simulator.requests import SimSequence
from simulator.steptime import PS, to_ps


class PDService:
    def __init__(self, fleet, spec: PDSpec):
        self.f, self.spec = fleet, spec
        n = len(fleet.wl)
        self.waiting: deque[SimSequence] = deque()  # prefilled, waiting for decode-side room
        self.disaggregated = np.zeros(n, dtype=bool)
        self.prefill_replica = np.full(n, -1, dtype=np.int64)
        self.prefill_sched = np.full(n, -1, dtype=np.int64)  # first step on the prefill replica
        self.prefilled = np.full(n, -1, dtype=np.int64)  # the prefill hop's end
        self.reserved = np.full(n, -1, dtype=np.int64)  # decode blocks reserved, transfer starts
        self.transferred = np.full(n, -1, dtype=np.int64)  # the KV is on the decode replica
        self.decode_hit = np.zeros(n, dtype=np.int64)  # prompt tokens the decode replica had cached
        self.transfer_bytes = 0.0

    def _ready(self, pool: int) -> list:
        return [r for r in self.f.ready if r.pool.index == pool]

    # -- routing (the P/D profile) ---------------------------------------------------------------
    def route(self, seq: SimSequence) -> None:
        f, sp = self.f, self.spec
        decode = self._ready(sp.decode_pool)
        if not decode:
            f.backlog.append(seq)
            return
        cached = max(self.cached_tokens(r, seq) for r in decode)
        if seq.num_prompt_tokens - cached <= sp.threshold:
            f.send(seq, decode)  # not worth a transfer: the decode replica does it all
            return
        prefill = self._ready(sp.prefill_pool)
        if not prefill:
            f.backlog.append(seq)
            return
        self.disaggregated[seq.index] = True
        hop = SimSequence(seq.index, seq.token_ids, 1, seq.arrival_time)
        hop.pd_decode = seq  # the original request, its decode hop to come
        f.send(hop, prefill)

    @staticmethod
    def cached_tokens(rep, seq: SimSequence) -> int:
        """The prompt's prefix-cache hit on a decode replica at this instant."""
        rep.catch_up()
        return len(rep.bm.lookup_prefix(seq)[0]) * rep.bm.block_size

    def on_ready(self, rep) -> None:
        if rep.pool.index == self.spec.prefill_pool:
            self._hold_on_finish(rep.bm)
        if self.waiting:
            self.admit()

    @staticmethod
    def _hold_on_finish(bm) -> None:
        """A producer keeps a finished prefill's KV blocks referenced until the decode side has read
        them (vLLM's producer frees them on the consumer's confirmation)."""
        free = bm.free

        def hold(seq) -> None:
            if getattr(seq, "pd_decode", None) is None or seq.num_output_tokens == 0:
                return free(seq)  # anything else, or a prefill hop preempted: freed as usual
            seq.pd_held = seq.block_table
            seq.block_table, seq.block_hashes, seq.num_computed_tokens = [], [], 0

        bm.free = hold

    @staticmethod
    def _release(bm, blocks: list) -> None:
        if bm.allocator is None:  # the counting block manager (simulator.kvcount)
            bm._free += len(blocks)
        else:
            for b in reversed(blocks):
                bm.allocator.free(b)

    def on_finish(self, rep, seq: SimSequence) -> bool:
        """True when `seq` was a prefill hop (handled here); else the request's own end."""
        orig = getattr(seq, "pd_decode", None)
        if orig is not None:
            i = seq.index
            self.prefill_replica[i], self.prefilled[i] = rep.id, self.f.env.now
            self.prefill_sched[i] = seq.first_scheduled_time
            orig.first_cached = seq.first_cached  # the prompt's hit is the prefill side's
            orig.pd_held = (rep, seq.pd_held)
            self.waiting.append(orig)
            self.admit()
            return True
        if self.disaggregated[seq.index]:  # the request's queue time counts from its prefill's start
            seq.first_scheduled_time = int(self.prefill_sched[seq.index])
        if rep.pool.index == self.spec.decode_pool and self.waiting:
            self.admit()  # its blocks and slot are free now
        return False

    # -- decode-side admission and the transfer ---------------------------------------------------
    def has_room(self, rep, seq: SimSequence) -> bool:
        """A free sequence slot and the KV blocks the prompt needs beyond the replica's cached prefix."""
        if rep.num_running + rep.reserved >= rep.pool.spec.max_num_seqs:
            return False
        rep.catch_up()
        hits = rep.bm.lookup_prefix(seq)[0]
        return rep.bm.can_admit(seq, hits, seq.num_prompt_tokens - len(hits) * rep.bm.block_size)

    @staticmethod
    def reserve(rep, seq: SimSequence) -> int:
        """Shares the replica's cached prefix of the prompt and takes blocks for the rest (its KV
        usage counts them from now on); returns the tokens to move."""
        rep.catch_up()
        hits, hashes = rep.bm.lookup_prefix(seq)
        rep.bm.admit(seq, hits, hashes)
        rest = seq.num_prompt_tokens - seq.num_computed_tokens
        rep.bm.append_slots(seq, rest)
        rep.reserved += 1
        rep.cut_stretch()  # fewer free blocks: the stretch in progress is re-planned after its step
        return rest

    def admit(self) -> None:
        f = self.f
        while self.waiting:
            seq = self.waiting[0]
            decode = self._ready(self.spec.decode_pool)
            room = [r for r in decode if self.has_room(r, seq)]
            if not room:
                return  # head of line waits for a finish or a new decode replica
            self.waiting.popleft()
            k = f.router.pick(room, seq.token_ids if f.router.uses_prefix else None)
            rep = room[k]
            f.requests.routed(seq.index, rep.id, rep.pool.index)
            rest = self.reserve(rep, seq)
            now = f.env.now
            self.reserved[seq.index] = now
            hit = self.decode_hit[seq.index] = seq.num_prompt_tokens - rest
            moved, seq.pd_computed = self.spec.moves(seq.num_prompt_tokens, hit, rep.bm.block_size)
            seq.replica_arrival = now
            self.transfer_bytes += moved * self.spec.kv_bytes_per_token
            # the decode hop is an HTTP request to the decode replica too
            delay = to_ps(self.spec.transfer_seconds(moved)) + f.frontend_ps(rep, seq)
            f.env.timeout(delay).callbacks.append(lambda _, s=seq, r=rep: self._arrive(s, r))

    def _arrive(self, seq: SimSequence, rep) -> None:
        """The KV is in the reserved blocks: the request joins the decode batch."""
        now = self.f.env.now
        self.transferred[seq.index] = now
        rep.reserved -= 1
        producer, blocks = seq.pd_held
        self._release(producer.bm, blocks)  # the read is confirmed: the producer frees its blocks
        producer.poke()  # a prompt waiting there for blocks may start now
        seq.pd_held = None
        seq.num_computed_tokens = seq.pd_computed  # the rest (at least the last token) is computed here
        seq.status = SequenceStatus.RUNNING
        seq.first_scheduled_time = now
        rep.sched.running.append(seq)
        rep.outstanding += 1
        rep.metrics.inc("arrivals")
        rep.poke()

    # -- what the run reports ---------------------------------------------------------------------
    def table(self) -> dict[str, np.ndarray]:
        """Per-request P/D timings in seconds (NaN where the request was not disaggregated)."""
        def span(a, b):
            return np.where((a >= 0) & (b >= 0), (b - a) / PS, np.nan)

        arrival = self.f.arrival_ps
        return {
            "disaggregated": self.disaggregated.copy(),
            "prefill_queue": span(arrival, self.prefill_sched),
            "prefill": span(self.prefill_sched, self.prefilled),
            "admission_wait": span(self.prefilled, self.reserved),
            "decode_cached": np.where(self.disaggregated, self.decode_hit, np.nan),  # tokens not moved
            "transfer": span(self.reserved, self.transferred),
            "first_decode_step": span(self.transferred, self.f.requests.first_token),
        }

    def summary(self) -> dict:
        t = self.table()
        d = t["disaggregated"]

        def pcts(x):
            x = x[~np.isnan(x)]
            if not len(x):
                return None
            return {"p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
                    "max": float(x.max()), "mean": float(x.mean())}

        return {
            "disaggregated": int(d.sum()),
            "whole_on_decode": int(np.count_nonzero((self.f.requests.pool == self.spec.decode_pool) & ~d)),
            "waiting_for_decode_at_end": len(self.waiting),
            "kv_transfer_bytes": self.transfer_bytes,
            **{k: pcts(v) for k, v in t.items() if k != "disaggregated"},
        }
