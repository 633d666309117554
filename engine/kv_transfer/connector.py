"""One engine's KV-transfer role, as the server's engine thread drives it.

on_add() takes a request's kv_transfer_params: a do_remote_decode request is marked for a lease
when it finishes; a do_remote_prefill request is held back while its blocks are pulled. on_finished()
leases a marked request's blocks and returns the params to answer with. tick() ends confirmed and
expired leases and hands back the pulled requests to queue. All three run on the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.sequence import Sequence
from engine.kv_transfer.blocks import kv_layout
from engine.kv_transfer.config import KVTransferConfig
from engine.kv_transfer.consumer import KVConsumer, Pull
from engine.kv_transfer.producer import KVProducer


class KVConnector:
    def __init__(self, cfg: KVTransferConfig, engine, wake: Callable[[], None]):
        emulated = not hasattr(engine.runner, "kv_caches")
        if emulated and cfg.kv_bytes_per_token is None:
            raise ValueError("an emulated engine with --kv-transfer-config needs the KV bytes per token: a "
                             "derived latency model, or kv_connector_extra_config.kv_bytes_per_token")
        if cfg.is_producer and not engine.block_manager.enable_prefix_caching:
            raise ValueError("a KV producer finds a prefill's blocks through the prefix cache: drop "
                             "--no-prefix-caching")
        self.cfg = cfg
        self.layout = kv_layout(engine.runner, cfg.kv_bytes_per_token)
        self.producer = KVProducer(cfg, engine, self.layout, wake) if cfg.is_producer else None
        self.consumer = KVConsumer(engine, self.layout, wake, cfg if emulated else None) \
            if cfg.is_consumer else None
        self._to_lease: set[str] = set()

    def on_add(self, request_id: str, prompt_ids: list[int], params: dict[str, Any] | None,
               args: tuple) -> bool:
        """True when the request is held back for a pull (queued later by tick()); ValueError when
        its params ask for a role this engine does not have or are malformed."""
        if not params:
            return False
        if params.get("do_remote_decode"):
            if self.producer is None:
                raise ValueError(f"this engine's kv_role is {self.cfg.kv_role}: it cannot serve "
                                 "do_remote_decode (a prefill for another engine)")
            self._to_lease.add(request_id)
            return False
        if params.get("do_remote_prefill"):
            if self.consumer is None:
                raise ValueError(f"this engine's kv_role is {self.cfg.kv_role}: it cannot serve "
                                 "do_remote_prefill (read KV blocks from another engine)")
            self.consumer.begin(request_id, prompt_ids, params, args)
            return True
        return False

    def on_finished(self, seq: Sequence) -> dict[str, Any] | None:
        if seq.request_id not in self._to_lease:
            return None
        self._to_lease.discard(seq.request_id)
        if seq.finish_reason in ("abort", "error"):
            return None
        return self.producer.lease(seq)

    def abort(self, request_id: str) -> bool:
        """True when the request was a pull in flight (its blocks are dropped when the pull ends)."""
        self._to_lease.discard(request_id)
        return self.consumer is not None and self.consumer.abort(request_id)

    def tick(self) -> tuple[int, list[tuple[Pull, str | None]]]:
        """(blocks freed by ended leases, pulls that came back)."""
        freed = self.producer.tick() if self.producer is not None else 0
        return freed, self.consumer.finish() if self.consumer is not None else []

    @property
    def has_pending(self) -> bool:
        return bool(self.consumer and self.consumer.pulls)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
