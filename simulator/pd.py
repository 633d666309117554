"""A disaggregated service in the simulated fleet: prefill pool -> KV transfer -> decode pool.

The flow follows the live one (vLLM's P/D protocol behind llm-d's P/D profile):

1. The router looks at the decode pool: if the prompt's uncached tokens (its longest prefix-cache hit
   on any ready decode replica) are at most the threshold, the whole request goes to a decode replica.
2. Otherwise a prefill replica computes the prompt as a `max_tokens: 1` request (its own scheduler,
   batching, chunking and prefix cache; its metrics are the prefill role's).
3. Decode-side admission, first come first served: a ready decode replica with free KV blocks for the
   prompt and a free sequence slot reserves the blocks (they count in its KV usage from then on); when
   none has room the prefilled request waits, and that wait is measured.
4. The KV moves: link latency + prompt tokens x KV bytes per token / bandwidth (no contention between
   transfers). The request then joins the decode replica's running batch with all but the last prompt
   token computed, so its first step recomputes that token and samples the first output token
   (vLLM's consumer does the same). TTFT = prefill queue + prefill + admission wait + transfer + that
   first decode step.

Simplifications, stated: the producer frees its blocks when its hop finishes (it does not hold them
until the read); decode-side prefix hits do not shorten the transfer; failures are not modelled for
P/D pools (the scenario refuses them). The fast path stays on: reservations and arrivals cut a decode
stretch at the step in progress, as any arrival does (tests/test_sim_pd.py proves per-request timings
equal to the step-by-step run).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engine.core.block_manager import cdiv
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
        """The prompt's prefix-cache hit on a decode replica now. Inside a decode stretch the blocks
        its steps (and reservations deferred behind them) will take have not been taken yet; a
        step-by-step run has taken them, evicting the cached blocks at the head of the free queue,
        so those are not hits."""
        hits = rep.bm.lookup_prefix(seq)[0]
        ahead = rep.ff_extra_blocks() + rep.deferred_blocks
        if hits and ahead and any(rep.bm.allocator.is_free(b) for b in hits):
            gone = set(rep.bm.allocator.free_queue()[:ahead])
            hits = hits[: next((k for k, b in enumerate(hits) if b in gone), len(hits))]
        return len(hits) * rep.bm.block_size

    def on_finish(self, rep, seq: SimSequence) -> bool:
        """True when `seq` was a prefill hop (handled here); else the request's own end."""
        orig = getattr(seq, "pd_decode", None)
        if orig is not None:
            i = seq.index
            self.prefill_replica[i], self.prefilled[i] = rep.id, self.f.env.now
            self.prefill_sched[i] = seq.first_scheduled_time
            orig.first_cached = seq.first_cached  # the prompt's hit is the prefill side's
            self.waiting.append(orig)
            self.admit()
            return True
        if self.disaggregated[seq.index]:  # the request's queue time counts from its prefill's start
            seq.first_scheduled_time = int(self.prefill_sched[seq.index])
        if rep.pool.index == self.spec.decode_pool and self.waiting:
            self.admit()  # its blocks and slot are free now
        return False

    # -- decode-side admission and the transfer ---------------------------------------------------
    def has_room(self, rep, blocks: int) -> bool:
        spec = rep.pool.spec
        if rep.num_running + rep.reserved >= spec.max_num_seqs:
            return False
        return rep.bm.num_free_blocks - rep.ff_extra_blocks() - rep.deferred_blocks >= blocks

    @staticmethod
    def reserve(rep, seq: SimSequence) -> None:
        """Takes the prompt's KV blocks on the decode replica (its KV usage counts them from now on).
        Inside a decode stretch the blocks the stretch has grown into are not taken yet: the
        reservation waits for them (the stretch is cut at the step in progress) so blocks are taken
        in the order, and with the evictions, of a step-by-step run."""
        rep.reserved += 1
        if rep._grow is None:
            rep.bm.append_slots(seq, seq.num_prompt_tokens)
            return
        rep.deferred.append((seq, seq.num_prompt_tokens))
        rep.deferred_blocks += cdiv(seq.num_prompt_tokens, rep.bm.block_size)
        rep.cut_stretch()

    def admit(self) -> None:
        f = self.f
        while self.waiting:
            seq = self.waiting[0]
            decode = self._ready(self.spec.decode_pool)
            room = [r for r in decode if self.has_room(r, cdiv(seq.num_prompt_tokens, r.bm.block_size))]
            if not room:
                return  # head of line waits for a finish or a new decode replica
            self.waiting.popleft()
            k = f.router.pick(room, seq.token_ids if f.router.uses_prefix else None)
            rep = room[k]
            f.requests.routed(seq.index, rep.id, rep.pool.index)
            self.reserve(rep, seq)
            now = f.env.now
            self.reserved[seq.index] = now
            seq.replica_arrival = now
            self.transfer_bytes += seq.num_prompt_tokens * self.spec.kv_bytes_per_token
            delay = to_ps(self.spec.transfer_seconds(seq.num_prompt_tokens))
            f.env.timeout(delay).callbacks.append(lambda _, s=seq, r=rep: self._arrive(s, r))

    def _arrive(self, seq: SimSequence, rep) -> None:
        """The KV is in the reserved blocks: the request joins the decode batch."""
        now = self.f.env.now
        self.transferred[seq.index] = now
        rep.reserved -= 1
        seq.num_computed_tokens = seq.num_prompt_tokens - 1  # the last token is recomputed for logits
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
