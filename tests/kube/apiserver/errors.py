"""API errors as the API server reports them: a `Status` object with a code, a reason and causes."""

from __future__ import annotations

REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict",
           410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 401: "Unauthorized"}


class ApiError(Exception):
    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "InternalError")
        self.details = details

    def status(self) -> dict:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            out["details"] = self.details
        return out


def resource_name(t) -> str:
    """`deployments.apps`, `pods`: how messages name a resource."""
    return f"{t.plural}.{t.group}" if t.group else t.plural


def not_found(t, name: str) -> ApiError:
    return ApiError(404, f'{resource_name(t)} "{name}" not found',
                    details={"name": name, "group": t.group, "kind": t.plural})


def already_exists(t, name: str) -> ApiError:
    return ApiError(409, f'{resource_name(t)} "{name}" already exists', "AlreadyExists",
                    details={"name": name, "group": t.group, "kind": t.plural})


def conflict(t, name: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {resource_name(t)} "{name}": the object has been '
                         f'modified; please apply your changes to the latest version and try again',
                    details={"name": name, "group": t.group, "kind": t.plural})


def invalid(t, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """causes: (field path, message) as the validators name them."""
    kind = f"{t.kind}.{t.group}" if t.group else t.kind
    texts = [f"{path}: {msg}" if path else msg for path, msg in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiError(422, f'{kind} "{name}" is invalid: {joined}',
                    details={"name": name, "group": t.group, "kind": t.kind,
                             "causes": [{"reason": "FieldValueInvalid", "message": m, "field": p}
                                        for p, m in causes]})
