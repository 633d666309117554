"""The PATCH content types: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge
patch reduced to merge-patch semantics (its `$` directives dropped; lists replaced whole)."""

from __future__ import annotations

import copy

from tests.kube.apiserver.errors import ApiError

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _strip_directives(patch):
    if isinstance(patch, dict):
        return {k: _strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [_strip_directives(v) for v in patch]
    return patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc, parts: list[str]):
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, parts[-1]


def json_patch(target, ops: list):
    doc = copy.deepcopy(target)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                cur = doc
                for p in parts:
                    cur = cur[int(p)] if isinstance(cur, list) else cur[p]
                if cur != op.get("value"):
                    raise ApiError(422, f"the server rejected our request due to an error in our request: "
                                        f"test operation failed at {op.get('path')}")
                continue
            if kind in ("move", "copy"):
                src, key = _parent(doc, _pointer(op["from"]))
                value = src[int(key)] if isinstance(src, list) else src[key]
                if kind == "move":
                    del src[int(key) if isinstance(src, list) else key]
                op = {"op": "add", "path": op["path"], "value": copy.deepcopy(value)}
                kind = "add"
            parent, key = _parent(doc, parts)
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if key == "-" else int(key), op["value"])
                else:
                    parent[key] = op["value"]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(key)] = op["value"]
                else:
                    if key not in parent:
                        raise KeyError(key)
                    parent[key] = op["value"]
            elif kind == "remove":
                del parent[int(key) if isinstance(parent, list) else key]
            else:
                raise ApiError(422, f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, f"the server rejected our request due to an error in our request: {kind} "
                                f"operation does not apply: doc is missing path: {op.get('path')}") from None
    return doc


def apply(content_type: str, target: dict, patch) -> dict:
    ctype = content_type.split(";")[0].strip()
    if ctype == MERGE:
        return merge_patch(target, patch)
    if ctype == STRATEGIC:
        return merge_patch(target, _strip_directives(patch))
    if ctype == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(400, "a JSON patch must be a list of operations")
        return json_patch(target, patch)
    raise ApiError(415, f"the body of the request was in an unknown format - accepted media types include: "
                        f"{JSON_PATCH}, {MERGE}, {STRATEGIC}")
