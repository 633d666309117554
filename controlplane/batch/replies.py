"""JSON answers and OpenAI-style errors of the Batch API, and its query strings."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from controlplane.router.http import Connection

KINDS = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "BadRequestError",
         409: "ConflictError", 413: "BadRequestError", 500: "InternalServerError"}
JSON = [(b"content-type", b"application/json")]


def reply(conn: Connection, status: int, obj) -> None:
    conn.respond(status, JSON, json.dumps(obj).encode())


def fail(conn: Connection, status: int, message: str, param: str | None = None) -> None:
    reply(conn, status, {"error": {"message": message, "type": KINDS.get(status, "BadRequestError"),
                                   "param": param, "code": status}})


class BadQuery(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def query(raw: bytes) -> dict[str, str]:
    """The query string's parameters (the last value of each)."""
    return {k: v[-1] for k, v in parse_qs(raw.decode("latin-1"), keep_blank_values=True).items()}


def int_param(q: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = q.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name} must be an integer, got {raw!r}", name) from None
    if not low <= value <= high:
        raise BadQuery(f"{name} must be between {low} and {high}, got {value}", name)
    return value


def page(objects: list[dict], has_more: bool) -> dict:
    return {"object": "list", "data": objects, "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None, "has_more": has_more}
