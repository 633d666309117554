"""Label and field selectors, and the simple JSONPaths (`.spec.replicas`) that scale subresources and
printer columns name."""

from __future__ import annotations

import re

_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=|\s+in\s+|\s+notin\s+)\s*(.*?))?\s*$")


class SelectorError(ValueError):
    pass


def _split(text: str) -> list[str]:
    """Commas outside parentheses separate requirements."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def parse_labels(text: str | None) -> list[tuple[str, str, set[str]]]:
    """[(key, op, values)] with op in =, !=, in, notin, exists, !exists."""
    reqs = []
    for part in _split(text or ""):
        m = _TERM.match(part)
        if not m:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
        neg, key, op, value = m.groups()
        if op is None:
            reqs.append((key, "!exists" if neg else "exists", set()))
            continue
        op = op.strip()
        if op in ("in", "notin"):
            if not (value.startswith("(") and value.endswith(")")):
                raise SelectorError(f"unable to parse requirement: {part.strip()!r}: values need parentheses")
            reqs.append((key, op, {v.strip() for v in value[1:-1].split(",") if v.strip()}))
        else:
            reqs.append((key, "!=" if op == "!=" else "=", {value}))
    return reqs


def match_labels(reqs, labels: dict | None) -> bool:
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        if op == "exists" and not present or op == "!exists" and present:
            return False
        if op in ("=", "in") and (not present or labels[key] not in values):
            return False
        if op in ("!=", "notin") and present and labels[key] in values:
            return False
    return True


def selector_string(selector: dict | None) -> str:
    """A LabelSelector (matchLabels, matchExpressions) as the string a Scale's status carries."""
    selector = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        op, key, values = e.get("operator"), e.get("key"), sorted(e.get("values") or [])
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def parse_fields(text: str | None) -> list[tuple[str, bool, str]]:
    """[(dotted path, equal?, value)] from `metadata.name=x,status.phase!=Failed`."""
    out = []
    for part in _split(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise SelectorError(f"invalid field selector: {part.strip()!r}")
        out.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return out


def match_fields(reqs, obj: dict) -> bool:
    for path, equal, value in reqs:
        got = get_path(obj, "." + path)
        got = "" if got is None else str(got)
        if (got == value) != equal:
            return False
    return True


def _keys(path: str) -> list[str]:
    if not path.startswith("."):
        raise ValueError(f"{path!r}: a JSONPath here starts with '.'")
    return [k for k in path[1:].split(".") if k]


def get_path(obj, path: str):
    for key in _keys(path):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def set_path(obj: dict, path: str, value) -> None:
    keys = _keys(path)
    for key in keys[:-1]:
        obj = obj.setdefault(key, {})
    obj[keys[-1]] = value
