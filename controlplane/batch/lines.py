"""A batch's input lines, checked, and the output and error lines in OpenAI's shape:

    input   {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
    output  {"id": "batch_req_...", "custom_id": "a",
             "response": {"status_code": 200, "request_id": "...", "body": {...}}, "error": null}
    error   the same with a non-2xx response, or "response": null and "error": {"code", "message"}

A line that cannot be sent (not JSON, no custom_id or a repeated one, a method other than POST, a URL
other than /v1/completions and /v1/chat/completions, a body that is not an object or has no model, a
stream) is answered in the error file with its reason and is listed in the batch's `errors`; the
other lines go on. Blank lines are skipped. Unlike OpenAI, which takes only the batch's endpoint, a
line may name either of the two: each line goes to its own URL (completions and chat in one file).
"""

from __future__ import annotations

import json
import uuid

from controlplane.batch.store import FAILED, PENDING
from controlplane.router.prompt import PromptReader, request_prompt

MAX_ERRORS_LISTED = 1000  # in the batch object's errors.data; every one is in the error file


def output_line(custom_id: str | None, status: int, request_id: str, body) -> str:
    return json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
                       "response": {"status_code": status, "request_id": request_id, "body": body},
                       "error": None}, separators=(",", ":"))


def error_line(custom_id: str | None, code: str, message: str) -> str:
    return json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": message}}, separators=(",", ":"))


class LineError(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.param = code, param


URLS = ("/v1/completions", "/v1/chat/completions")


def check_line(text: str, seen: set[str]) -> tuple[str, str, dict]:
    """(custom_id, url, body) of a sendable line; LineError with the reason otherwise."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise LineError("invalid_json_line", f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise LineError("invalid_request", "a line must be a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise LineError("missing_required_parameter", "custom_id must be a non-empty string", "custom_id")
    if cid in seen:
        raise LineError("duplicate_custom_id", f"custom_id {cid!r} appears on an earlier line", "custom_id")
    seen.add(cid)
    if obj.get("method") != "POST":
        raise LineError("invalid_request", f"method must be POST, got {obj.get('method')!r}", "method")
    url = obj.get("url")
    if url not in URLS:
        raise LineError("invalid_request", f"url must be one of {', '.join(URLS)}, got {url!r}", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", "body")
    if not isinstance(body.get("model"), str):
        raise LineError("invalid_request", "body.model must be a string", "body.model")
    if body.get("stream"):
        raise LineError("invalid_request", "streaming is not supported in a batch", "body.stream")
    return cid, url, body


def custom_id_of(text: str) -> str | None:
    """The custom_id of a line that failed its check, when one can be read."""
    try:
        cid = json.loads(text).get("custom_id")
    except (ValueError, AttributeError):
        return None
    return cid if isinstance(cid, str) else None


def split(content: bytes, deadline: float, reader: PromptReader) -> tuple[list[tuple], list[dict]]:
    """The store's rows for every line (line, custom_id, url, body, state, result, prompt_tokens,
    max_tokens, deadline) and the batch errors (code, line, message, param) of the lines that cannot be
    sent."""
    rows, errors, seen = [], [], set()
    text = content.decode("utf-8")
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            cid, url, body = check_line(raw, seen)
        except LineError as exc:
            cid = custom_id_of(raw)
            message = f"line {n}: {exc}"
            rows.append((n, cid, None, None, FAILED, error_line(cid, exc.code, message), 0, 0, deadline))
            if len(errors) < MAX_ERRORS_LISTED:
                errors.append({"code": exc.code, "line": n, "message": message, "param": exc.param})
            continue
        _, tokens = reader.read(request_prompt(body, url == URLS[1]))
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        out = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else 0
        text = json.dumps(body, separators=(",", ":"))
        rows.append((n, cid, url, text, PENDING, None, tokens, out, deadline))
    return rows, errors
