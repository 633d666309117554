"""/v1/batches: create, get, list and cancel (OpenAI's Batch object).

    POST /v1/batches               {"input_file_id", "endpoint", "completion_window": "24h", "metadata"}
    GET  /v1/batches/{id}
    GET  /v1/batches               ?after=&limit=(1-100, default 20), newest first
    POST /v1/batches/{id}/cancel

A new batch is `validating` until the runner has read its file into per-line rows, then
`in_progress`, `finalizing` while its output and error files are written, then `completed`; or
`failed` (no line could be sent), `expired` (its window passed first), `cancelling` then `cancelled`.
`completion_window` is "24h" at OpenAI; a shorter duration ("90s", "30m", "2h") is taken too, for
deadline-driven tests and short jobs. GET of a running batch adds `slopilot_outlook`
({deadline_slack_seconds, at_risk}): whether its window can still be met at the current answer rate.
"""

from __future__ import annotations

import json
import re
import time
import uuid

from controlplane.batch.replies import BadQuery, fail, int_param, page, query, reply
from controlplane.batch.store import Store
from controlplane.router.http import Connection, Request

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_WINDOW = 24 * 3600.0
_WINDOW = re.compile(r"^(\d+)(s|m|h)$")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def window_seconds(value) -> float:
    m = _WINDOW.match(value) if isinstance(value, str) else None
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)] if m else 0
    if not 0 < seconds <= MAX_WINDOW:
        raise ValueError(f"completion_window must be '24h' (or a shorter duration such as '30m'), "
                         f"got {value!r}")
    return float(seconds)


def check_metadata(meta) -> dict | None:
    if meta is None:
        return None
    if not isinstance(meta, dict) or len(meta) > 16:
        raise ValueError("metadata must be an object of at most 16 string pairs")
    for k, v in meta.items():
        if not isinstance(v, str) or len(k) > 64 or len(v) > 512:
            raise ValueError(f"metadata[{k!r}]: keys up to 64 characters, values strings up to 512")
    return meta


def new_batch(file_id: str, endpoint: str, window: str, seconds: float, metadata, now: float) -> dict:
    return {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": file_id, "completion_window": window, "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": int(now), "in_progress_at": None,
            "expires_at": int(now + seconds), "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
            "model": None, "usage": None}


class BatchesApi:
    def __init__(self, store: Store, runner, clock=time.time, slacks=None):
        """slacks(now) -> {batch id: seconds to spare} (the metrics'), for the outlook of GET."""
        self.store, self.runner, self.clock, self.slacks = store, runner, clock, slacks

    async def handle(self, req: Request, conn: Connection, rest: list[str]) -> None:
        m = req.method
        if not rest:
            if m == "POST":
                return self.create(req, conn)
            if m == "GET":
                return self.list(req, conn)
        elif len(rest) == 1 and m == "GET":
            doc = self.store.get_batch(rest[0])
            if doc is None:
                return fail(conn, 404, f"No such Batch object: {rest[0]}", "id")
            return reply(conn, 200, self.with_outlook(doc))
        elif len(rest) == 2 and rest[1] == "cancel" and m == "POST":
            return self.cancel(rest[0], conn)
        return fail(conn, 405 if len(rest) <= 2 else 404, f"{m} is not allowed on {req.path}")

    def create(self, req: Request, conn: Connection) -> None:
        try:
            data = json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as exc:
            return fail(conn, 400, f"malformed JSON body: {exc}")
        if not isinstance(data, dict):
            return fail(conn, 400, "the body must be a JSON object")
        file_id = data.get("input_file_id")
        if not isinstance(file_id, str):
            return fail(conn, 400, "missing required parameter `input_file_id`", "input_file_id")
        f = self.store.get_file(file_id)
        if f is None:
            return fail(conn, 404, f"No such File object: {file_id}", "input_file_id")
        if f["purpose"] != "batch":
            return fail(conn, 400, f"file {file_id} has purpose {f['purpose']!r}, not 'batch'",
                        "input_file_id")
        endpoint = data.get("endpoint")
        if endpoint not in ENDPOINTS:
            return fail(conn, 400, f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}",
                        "endpoint")
        try:
            seconds = window_seconds(data.get("completion_window"))
        except ValueError as exc:
            return fail(conn, 400, str(exc), "completion_window")
        try:
            metadata = check_metadata(data.get("metadata"))
        except ValueError as exc:
            return fail(conn, 400, str(exc), "metadata")
        doc = new_batch(file_id, endpoint, data["completion_window"], seconds, metadata, self.clock())
        self.store.add_batch(doc)
        self.runner.wake()
        reply(conn, 200, doc)

    def with_outlook(self, doc: dict) -> dict:
        """A running batch's object with `slopilot_outlook` (not OpenAI's; clients ignore it): its time
        to spare at the current answer rate and whether its window will be missed at that rate."""
        if doc["status"] in ("in_progress", "cancelling") and self.slacks is not None:
            slack = self.slacks(self.clock()).get(doc["id"])
            if slack is not None:
                doc["slopilot_outlook"] = {"deadline_slack_seconds": round(slack, 1), "at_risk": slack < 0}
        return doc

    def list(self, req: Request, conn: Connection) -> None:
        q = query(req.query)
        try:
            limit = int_param(q, "limit", 20, 1, 100)
        except BadQuery as exc:
            return fail(conn, 400, str(exc), exc.param)
        reply(conn, 200, page(*self.store.list_batches(q.get("after"), limit)))

    def cancel(self, batch_id: str, conn: Connection) -> None:
        doc = self.store.get_batch(batch_id)
        if doc is None:
            return fail(conn, 404, f"No such Batch object: {batch_id}", "id")
        if doc["status"] in TERMINAL or doc["status"] == "finalizing":
            return fail(conn, 409, f"Cannot cancel a batch with status '{doc['status']}'.")
        if doc["status"] != "cancelling":
            now = int(self.clock())

            def cancelling(d: dict) -> None:
                if d["status"] in ("validating", "in_progress"):
                    d["status"], d["cancelling_at"] = "cancelling", now
            doc = self.store.update_batch(batch_id, cancelling)
            self.runner.wake()
        reply(conn, 200, doc)
