"""A batch's state changes in the store, each one transaction (run in a worker thread: a 50,000-line
file takes a while to read and to write out):

    validate   validating -> in_progress (its lines stored), or failed when no line can be sent
    close      the lines still pending -> expired or cancelled, each answered in the error file
    finalize   in_progress/finalizing -> completed (or expired, cancelled): the output file (2xx
               answers) and the error file (the rest), in input order, written with the final status
"""

from __future__ import annotations

import time
import uuid

from controlplane.batch.lines import error_line, split
from controlplane.batch.store import CANCELLED, CHUNK, COMPLETED, EXPIRED, FAILED, PENDING, Store
from controlplane.router.prompt import PromptReader

CLOSED = {EXPIRED: ("expired", "batch_expired", "This request could not be executed before the completion "
                                                 "window expired."),
          CANCELLED: ("cancelled", "batch_cancelled", "The batch was cancelled before this request was "
                                                      "executed.")}


def validate(store: Store, doc: dict, reader: PromptReader) -> dict | None:
    """Reads the batch's input file into its lines; the batch object after."""
    now = int(time.time())
    content = store.file_content(doc["input_file_id"])
    if content is None:
        rows, errors = [], [{"code": "file_not_found", "line": None, "param": "input_file_id",
                             "message": f"the input file {doc['input_file_id']} was deleted"}]
    else:
        rows, errors = split(content, float(doc["expires_at"]), reader)
    sendable = sum(1 for r in rows if r[4] == PENDING)

    def started(d: dict) -> None:
        d["request_counts"] = {"total": len(rows), "completed": 0, "failed": len(rows) - sendable}
        d["errors"] = {"object": "list", "data": errors} if errors else None
        if d["status"] != "validating":  # cancelled meanwhile: its lines are closed as cancelled
            return
        if sendable:
            d["status"], d["in_progress_at"] = "in_progress", now
        else:
            d["status"], d["failed_at"] = "failed", now
            d["errors"] = {"object": "list", "data": errors or [
                {"code": "empty_file", "line": None, "param": "input_file_id", "message": "no lines"}]}

    return store.replace_lines(doc["id"], rows if sendable else [], started)


def close(store: Store, batch_id: str, state: int) -> int:
    """Every pending line answered as expired or cancelled, a chunk a transaction; how many."""
    _, code, message = CLOSED[state]
    total = 0
    while True:
        with store.tx() as c:
            n = store.close_pending(batch_id, state, lambda cid: error_line(cid, code, message), c)

            def count(d: dict) -> None:
                d["request_counts"]["failed"] += n
            if n:
                store.update_batch(batch_id, count, c)
        total += n
        if n < CHUNK:
            return total


def close_and_finalize(store: Store, batch_id: str, state: int) -> int:
    n = close(store, batch_id, state)
    finalize(store, batch_id, CLOSED[state][0])
    return n


def finalizing(store: Store, batch_id: str) -> dict | None:
    def mark(d: dict) -> None:
        if d["status"] == "in_progress":
            d["status"], d["finalizing_at"] = "finalizing", int(time.time())
    return store.update_batch(batch_id, mark)


def finalize(store: Store, batch_id: str, final: str) -> dict | None:
    """The output and error files and the final status (completed, expired or cancelled), together."""
    output = "".join(line + "\n" for line in store.results(batch_id, (COMPLETED,))).encode()
    errors = "".join(line + "\n" for line in store.results(batch_id, (FAILED, EXPIRED, CANCELLED))).encode()
    now = int(time.time())
    with store.tx() as c:
        ids = {}
        for kind, content in (("output", output), ("error", errors)):
            if content:
                ids[kind] = f"file-{uuid.uuid4().hex[:24]}"
                store.add_file({"id": ids[kind], "purpose": "batch_output", "bytes": len(content),
                                "filename": f"{batch_id}_{kind}.jsonl", "created_at": now}, content, c)

        def done(d: dict) -> None:
            d["status"], d[f"{final}_at"] = final, now
            d["output_file_id"], d["error_file_id"] = ids.get("output"), ids.get("error")
        return store.update_batch(batch_id, done, c)
