"""The Batch API's store: one SQLite database (stdlib sqlite3, WAL) under the router's state dir.

    files    id, purpose, filename, bytes, created_at, content (the whole file: inputs are bounded)
    batches  id, status, expires_at and the batch object as JSON (what GET returns)
    lines    one row per input line: custom_id, url, body, state (pending, completed, failed, expired,
             cancelled), its output line once answered, the prompt and max-token sizes for the backlog

A line's result and its batch's counts change in one transaction, and a batch's output and error
files are written in the same transaction that makes it `completed` (or `expired`, `cancelled`): a
process killed at any point leaves each line either pending (sent again after restart) or answered
once. WAL with synchronous=NORMAL survives a killed process (SIGKILL); `durable=True` (synchronous=
FULL) also survives a power loss, at an fsync per commit. One connection, shared under a lock: the
event loop uses it for short reads and writes, worker threads for the long ones, in chunks.

PostgreSQL (a design note, not built): this class is the only code that speaks SQL, and its
statements are plain SQL apart from `INSERT` ids and `BEGIN IMMEDIATE`; a Store over psycopg 3 with a
`postgresql://` DSN in place of the state dir would keep the same methods (BYTEA for content, JSONB
for the batch object, `SELECT ... FOR UPDATE` in update_batch, the same one-transaction rules), and
several routers could then share it if each claimed lines (`UPDATE ... SET owner` with `SKIP LOCKED`)
rather than reading every pending one as the single router here does.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

PENDING, COMPLETED, FAILED, EXPIRED, CANCELLED = range(5)

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, purpose TEXT NOT NULL,
    filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, status TEXT NOT NULL,
    expires_at REAL NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT, url TEXT, body TEXT,
    state INTEGER NOT NULL, result TEXT, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    max_tokens INTEGER NOT NULL DEFAULT 0, deadline REAL NOT NULL, PRIMARY KEY (batch_id, line));
CREATE INDEX IF NOT EXISTS lines_pending ON lines (state, deadline, batch_id, line);
"""
FILE_COLUMNS = "id, purpose, filename, bytes, created_at"
CHUNK = 2000  # lines a transaction or read when a whole batch is written or read (the lock is short)


class Store:
    def __init__(self, path: str | Path | None = None, durable: bool = False):
        """path: the database file (its folder is created); None: in memory (nothing survives)."""
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path) if path is not None else ":memory:"
        self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.lock = threading.RLock()
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self.conn.executescript(SCHEMA)

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on an exception)."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    # -- files -----------------------------------------------------------------------------------
    def add_file(self, file: dict, content: bytes, c: sqlite3.Connection | None = None) -> None:
        sql = f"INSERT INTO files ({FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?)"
        args = (file["id"], file["purpose"], file["filename"], file["bytes"], file["created_at"], content)
        if c is not None:
            c.execute(sql, args)
            return
        with self.tx() as c:
            c.execute(sql, args)

    def get_file(self, file_id: str) -> dict | None:
        rows = self._read(f"SELECT {FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        return _file(rows[0]) if rows else None

    def file_content(self, file_id: str) -> bytes | None:
        rows = self._read("SELECT content FROM files WHERE id = ?", (file_id,))
        return bytes(rows[0][0]) if rows else None

    def delete_file(self, file_id: str) -> bool:
        with self.tx() as c:
            return c.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0

    def list_files(self, after: str | None, limit: int, order: str = "desc",
                   purpose: str | None = None) -> tuple[list[dict], bool]:
        """A page of files by creation (desc: newest first) after the file `after`; (files, has_more)."""
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        where, args = [], []
        if after is not None:
            where.append(f"seq {op} COALESCE((SELECT seq FROM files WHERE id = ?), -1)")
            args.append(after)
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        sql = (f"SELECT {FILE_COLUMNS} FROM files {'WHERE ' + ' AND '.join(where) if where else ''} "
               f"ORDER BY seq {direction} LIMIT ?")
        rows = self._read(sql, (*args, limit + 1))
        return [_file(r) for r in rows[:limit]], len(rows) > limit

    # -- batches ---------------------------------------------------------------------------------
    def add_batch(self, doc: dict) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO batches (id, status, expires_at, doc) VALUES (?, ?, ?, ?)",
                      (doc["id"], doc["status"], doc["expires_at"], json.dumps(doc)))

    def put_batch(self, doc: dict, c: sqlite3.Connection | None = None) -> None:
        sql = "UPDATE batches SET status = ?, doc = ? WHERE id = ?"
        args = (doc["status"], json.dumps(doc), doc["id"])
        if c is not None:
            c.execute(sql, args)
            return
        with self.tx() as c:
            c.execute(sql, args)

    def get_batch(self, batch_id: str) -> dict | None:
        rows = self._read("SELECT doc FROM batches WHERE id = ?", (batch_id,))
        return json.loads(rows[0][0]) if rows else None

    def list_batches(self, after: str | None, limit: int) -> tuple[list[dict], bool]:
        """Newest first, after the batch `after`; (batches, has_more)."""
        if after is None:
            rows = self._read("SELECT doc FROM batches ORDER BY seq DESC LIMIT ?", (limit + 1,))
        else:
            rows = self._read("SELECT doc FROM batches WHERE seq < COALESCE((SELECT seq FROM batches "
                              "WHERE id = ?), -1) ORDER BY seq DESC LIMIT ?", (after, limit + 1))
        return [json.loads(r[0]) for r in rows[:limit]], len(rows) > limit

    def batches_in(self, *statuses: str) -> list[dict]:
        marks = ", ".join("?" * len(statuses))
        return [json.loads(r[0]) for r in self._read(
            f"SELECT doc FROM batches WHERE status IN ({marks}) ORDER BY expires_at, seq", statuses)]

    # -- lines -----------------------------------------------------------------------------------
    def replace_lines(self, batch_id: str, rows: Iterable[tuple], fn) -> dict | None:
        """The batch's lines (line, custom_id, url, body, state, result, prompt_tokens, max_tokens, deadline),
        instead of any it had, then fn(doc) applied to its object in the last transaction. Written in
        chunks, each its own transaction, so the event loop never waits long for the lock; a batch is
        read (and resumed) by its status, which only the last one changes."""
        rows = list(rows)
        with self.tx() as c:
            c.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
        for at in range(0, len(rows), CHUNK):
            with self.tx() as c:
                c.executemany("INSERT INTO lines (batch_id, line, custom_id, url, body, state, result, "
                              "prompt_tokens, max_tokens, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              ((batch_id, *r) for r in rows[at:at + CHUNK]))
        with self.tx() as c:
            return self.update_batch(batch_id, fn, c)

    def next_pending(self, limit: int) -> list[tuple]:
        """(batch_id, line, custom_id, url, body) of pending lines of in-progress batches, earliest
        deadline first, then by batch and line."""
        return self._read("SELECT l.batch_id, l.line, l.custom_id, l.url, l.body FROM lines l JOIN batches b "
                          "ON b.id = l.batch_id WHERE l.state = 0 AND b.status = 'in_progress' "
                          "ORDER BY l.deadline, l.batch_id, l.line LIMIT ?", (limit,))

    def update_batch(self, batch_id: str, fn, c: sqlite3.Connection | None = None) -> dict | None:
        """fn(doc) changes the batch object in place; read and written in one transaction."""
        if c is None:
            with self.tx() as c:
                return self.update_batch(batch_id, fn, c)
        row = c.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            return None
        doc = json.loads(row[0])
        fn(doc)
        self.put_batch(doc, c)
        return doc

    def record(self, results: list[tuple], written) -> None:
        """Answered lines (batch_id, line, state, output line, ...) in one transaction: a line no longer
        pending is left as it was; written(c, those written) runs in the same transaction (the
        batches' counts)."""
        with self.tx() as c:
            done = [r for r in results if c.execute(
                "UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND line = ? AND state = 0",
                (r[2], r[3], r[0], r[1])).rowcount]
            written(c, done)

    def close_pending(self, batch_id: str, state: int, result, c: sqlite3.Connection,
                      limit: int = CHUNK) -> int:
        """Up to `limit` pending lines of the batch answered with `state` and result(custom_id); how many."""
        rows = c.execute("SELECT line, custom_id FROM lines WHERE batch_id = ? AND state = 0 LIMIT ?",
                         (batch_id, limit)).fetchall()
        c.executemany("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND line = ?",
                      [(state, result(cid), batch_id, line) for line, cid in rows])
        return len(rows)

    def counts(self, batch_id: str) -> dict[int, int]:
        return dict(self._read("SELECT state, COUNT(*) FROM lines WHERE batch_id = ? GROUP BY state",
                               (batch_id,)))

    def results(self, batch_id: str, states: tuple[int, ...]) -> Iterator[str]:
        """The output lines of the batch's lines in these states, in input order (read in chunks)."""
        marks = ", ".join("?" * len(states))
        last = -1
        while True:
            rows = self._read(f"SELECT line, result FROM lines WHERE batch_id = ? AND line > ? AND state IN "
                              f"({marks}) ORDER BY line LIMIT ?", (batch_id, last, *states, CHUNK))
            yield from (r for _, r in rows)
            if len(rows) < CHUNK:
                return
            last = rows[-1][0]

    def backlog(self) -> list[tuple[str, float, int, int, int]]:
        """Per running batch with pending lines: (batch_id, deadline, lines, prompt tokens, max tokens)."""
        return self._read("SELECT l.batch_id, MIN(l.deadline), COUNT(*), SUM(l.prompt_tokens), "
                          "SUM(l.max_tokens) FROM lines l JOIN batches b ON b.id = l.batch_id "
                          "WHERE l.state = 0 AND b.status IN ('in_progress', 'cancelling') "
                          "GROUP BY l.batch_id")


def _file(row: tuple) -> dict:
    fid, purpose, filename, size, created = row
    return {"id": fid, "object": "file", "bytes": size, "created_at": created, "filename": filename,
            "purpose": purpose, "status": "processed", "status_details": None, "expires_at": None}
