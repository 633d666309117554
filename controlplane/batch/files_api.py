"""/v1/files: upload a batch input file, list, get, download, delete (OpenAI's File object).

    POST   /v1/files                 multipart/form-data: file (JSONL, UTF-8) and purpose=batch
    GET    /v1/files                 ?after=&limit=(1-10000)&order=asc|desc&purpose=
    GET    /v1/files/{id}            the File object
    GET    /v1/files/{id}/content    the bytes (an input file, or a batch's output or error file)
    DELETE /v1/files/{id}

An upload is checked whole before it is stored: its size (at most `max_bytes`, and the router's
request-body limit), UTF-8 text, at most `max_lines` non-blank lines. Each line's JSON is checked when
a batch is created from it (a bad line is answered in the batch's error file with its reason).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import time
import uuid

from controlplane.batch.replies import BadQuery, fail, int_param, page, query, reply
from controlplane.batch.store import Store
from controlplane.router.http import MAX_BODY_BYTES, Connection, Request

MAX_LINES = 50_000  # OpenAI's limit of requests in one batch input file


class UploadError(ValueError):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def form_fields(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data fields: name -> (filename, bytes), parsed by the stdlib's MIME parser."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise UploadError(400, "the upload must be multipart/form-data with the fields `file` and `purpose`")
    head = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not msg.is_multipart():
        raise UploadError(400, "malformed multipart/form-data body (no parts found)")
    fields = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


def check_upload(content_type: str, body: bytes, max_bytes: int, max_lines: int) -> tuple[str, bytes]:
    """(filename, content) of a valid batch input upload; UploadError with the reason otherwise."""
    fields = form_fields(content_type, body)
    if "purpose" not in fields:
        raise UploadError(400, "missing required field `purpose`", "purpose")
    purpose = fields["purpose"][1].decode("utf-8", "replace").strip()
    if purpose != "batch":
        raise UploadError(400, f"purpose must be 'batch' (the only purpose this server keeps), got "
                               f"{purpose!r}", "purpose")
    if "file" not in fields:
        raise UploadError(400, "missing required field `file`", "file")
    filename, content = fields["file"]
    if len(content) > max_bytes:
        raise UploadError(413, f"the file is {len(content)} bytes, over the limit of {max_bytes}", "file")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content[:exc.start].count(b"\n") + 1
        raise UploadError(400, f"the file is not UTF-8 text (line {line}, byte {exc.start})",
                          "file") from None
    lines = sum(1 for s in text.splitlines() if s.strip())
    if lines == 0:
        raise UploadError(400, "the file has no lines (a batch input file is JSONL: one request a line)",
                          "file")
    if lines > max_lines:
        raise UploadError(400, f"the file has {lines} lines, over the limit of {max_lines}", "file")
    return filename or "upload.jsonl", content


class FilesApi:
    def __init__(self, store: Store, max_bytes: int = MAX_BODY_BYTES, max_lines: int = MAX_LINES,
                 clock=time.time):
        self.store, self.max_bytes, self.max_lines, self.clock = store, max_bytes, max_lines, clock

    async def handle(self, req: Request, conn: Connection, rest: list[str]) -> None:
        """rest: the path after /v1/files, split on '/' ([] for the collection)."""
        m = req.method
        if not rest:
            if m == "POST":
                return await self.upload(req, conn)
            if m == "GET":
                return self.list(req, conn)
        elif len(rest) == 1 and m in ("GET", "DELETE"):
            f = self.store.get_file(rest[0])
            if f is None:
                return fail(conn, 404, f"No such File object: {rest[0]}", "id")
            if m == "GET":
                return reply(conn, 200, f)
            self.store.delete_file(f["id"])
            return reply(conn, 200, {"id": f["id"], "object": "file", "deleted": True})
        elif len(rest) == 2 and rest[1] == "content" and m == "GET":
            content = self.store.file_content(rest[0])
            if content is None:
                return fail(conn, 404, f"No such File object: {rest[0]}", "id")
            return conn.respond(200, [(b"content-type", b"application/octet-stream")], content)
        return fail(conn, 405 if len(rest) <= 2 else 404, f"{m} is not allowed on {req.path}")

    async def upload(self, req: Request, conn: Connection) -> None:
        if req.too_large:
            return fail(conn, 413, f"the upload is over the router's request limit of {MAX_BODY_BYTES} bytes "
                                   f"(files up to {min(self.max_bytes, MAX_BODY_BYTES)} bytes)", "file")
        ctype = next((v.decode("latin-1") for k, v in req.headers if k == b"content-type"), "")
        try:  # a large body is parsed off the event loop
            filename, content = await asyncio.to_thread(check_upload, ctype, req.body, self.max_bytes,
                                                        self.max_lines)
        except UploadError as exc:
            return fail(conn, exc.status, str(exc), exc.param)
        f = {"id": f"file-{uuid.uuid4().hex[:24]}", "purpose": "batch", "filename": filename,
             "bytes": len(content), "created_at": int(self.clock())}
        self.store.add_file(f, content)
        return reply(conn, 200, self.store.get_file(f["id"]))

    def list(self, req: Request, conn: Connection) -> None:
        q = query(req.query)
        try:
            limit = int_param(q, "limit", 10_000, 1, 10_000)
        except BadQuery as exc:
            return fail(conn, 400, str(exc), exc.param)
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            return fail(conn, 400, f"order must be 'asc' or 'desc', got {order!r}", "order")
        files, more = self.store.list_files(q.get("after"), limit, order, q.get("purpose"))
        reply(conn, 200, page(files, more))
