"""The Batch API as the router mounts it: the store under the state dir, the runner, the handlers.

    service = BatchService(router_state, state_dir="/var/lib/slopilot-router")
    service.start()                      # in the router's event loop (its startup)
    await service.handle(request, conn)  # /v1/files..., /v1/batches...
    await service.stop()                 # in-flight lines stop; they are pending at the next start

Without a state dir the store is in memory: the API works, nothing survives a restart.
The runner's requests carry the router's upstream key, else its own API key (what a client of the
router would have sent on), else no authorization.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

from controlplane.batch.batches_api import BatchesApi
from controlplane.batch.files_api import MAX_LINES, FilesApi
from controlplane.batch.metrics import BatchMetrics
from controlplane.batch.runner import BatchRunner
from controlplane.batch.store import Store
from controlplane.router.http import MAX_BODY_BYTES, Connection, Request

log = logging.getLogger("slopilot.router.batch")
PREFIXES = ("/v1/files", "/v1/batches")
DB_NAME = "batches.sqlite3"


def is_batch_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PREFIXES)


class BatchService:
    def __init__(self, st, state_dir: str | Path | None = None, max_inflight: int = 64,
                 max_file_bytes: int = MAX_BODY_BYTES, max_file_lines: int = MAX_LINES,
                 engine_priority: int | None = None):
        """st: the router's state (gate, metrics, reader, upstream, keys)."""
        try:
            self.store = Store(Path(state_dir) / DB_NAME if state_dir else None)
        except (OSError, sqlite3.Error) as exc:
            raise ValueError(f"state dir {state_dir}: cannot keep the Batch API's store there ({exc})") \
                from None
        if state_dir is None:
            log.warning("the Batch API keeps its files and batches in memory (no state dir): a restart "
                        "loses them")
        key = st.upstream_key or st.api_key
        headers = b"content-type: application/json\r\n"
        if key is not None:
            headers += b"authorization: Bearer %s\r\n" % key.encode("latin-1")
        self.metrics = BatchMetrics(st.metrics.registry, self.store)
        self.runner = BatchRunner(self.store, st.gate, st.reader, lambda: st.upstream, headers, self.metrics,
                                  max_inflight, engine_priority=engine_priority)
        self.files = FilesApi(self.store, max_file_bytes, max_file_lines)
        self.batches = BatchesApi(self.store, self.runner, slacks=self.metrics.slacks)
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.runner.run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        self.store.close()

    async def handle(self, req: Request, conn: Connection) -> None:
        parts = req.path.strip("/").split("/")  # v1, files|batches, ...
        api = self.files if parts[1] == "files" else self.batches
        await api.handle(req, conn, [p for p in parts[2:] if p])
