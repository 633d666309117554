"""Field-path validation against a JSON Schema: the one style for every input file (specs, scenarios).

    problems(schema, data)  -> [(("pools", 0, "replicas"), "must be >= 0, got -1"), ...]
    check(schema, doc)      -> ValueError "x.yaml:14: pools[0].replicas: must be >= 0, got -1; ..."

Numbers must be finite (.inf and .nan are not numbers here). Extension keywords, for the messages:
  x-number       a number, or a string holding one (KEDA trigger metadata is map[string]string)
  x-message      the reason to give instead of the generic one (type, enum, const, pattern, anyOf,
                 x-variants)
  x-exactly-one  [keys]: exactly one of these keys must be given
  x-at-most-one  [keys]: at most one of them
  x-variants     {key: schema}: the first of these keys present picks the schema the mapping must match
"""

from __future__ import annotations

import math
import re

import jsonschema
from jsonschema import ValidationError

from autoscaler.yamlfile import Document, document

NUMBER_RE = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")
TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "empty",
}


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _x_number(validator, value, instance, schema):
    text_ok = isinstance(instance, str) and NUMBER_RE.match(instance) and math.isfinite(float(instance))
    if value and not (is_number(instance) or text_ok):
        yield ValidationError("must be a number")


def _x_exactly_one(validator, keys, instance, schema):
    if isinstance(instance, dict):
        given = [k for k in keys if k in instance]
        if not given:
            yield ValidationError(f"give one of {', '.join(keys)}")
        elif len(given) > 1:
            yield ValidationError(f"give only one of {', '.join(given)}")


def _x_at_most_one(validator, keys, instance, schema):
    if isinstance(instance, dict):
        given = [k for k in keys if k in instance]
        if len(given) > 1:
            yield ValidationError(f"give only one of {', '.join(given)}")


def _x_variants(validator, variants, instance, schema):
    if not isinstance(instance, dict):
        return
    for key, sub in variants.items():
        if key in instance:
            yield from validator.descend(instance, sub)
            return
    yield ValidationError(f"give one of {', '.join(variants)}")


_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", lambda _, x: is_number(x))
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        "x-number": _x_number,
        "x-exactly-one": _x_exactly_one,
        "x-at-most-one": _x_at_most_one,
        "x-variants": _x_variants,
    },
    type_checker=_TYPES,
)


def _reasons(err: ValidationError) -> list[tuple[tuple, str]]:
    path = tuple(err.absolute_path)
    kind, arg, instance = err.validator, err.validator_value, err.instance
    got = "" if isinstance(instance, (dict, list)) else f", got {instance!r}"
    if kind == "required":
        return [(path + (k,), "is required") for k in arg if k not in instance]
    if kind == "additionalProperties":
        known = err.schema.get("properties", {})
        allowed = ", ".join(sorted(known))
        return [(path + (k,), f"unknown field (allowed: {allowed})") for k in instance if k not in known]
    custom = err.schema.get("x-message") if isinstance(err.schema, dict) else None
    if custom and kind in ("type", "enum", "const", "pattern", "anyOf", "x-variants"):
        return [(path, custom + got)]
    if kind == "type":
        names = arg if isinstance(arg, list) else [arg]
        return [(path, "must be " + " or ".join(TYPE_NAMES.get(n, n) for n in names) + got)]
    if kind in ("enum", "const"):
        options = arg if kind == "enum" else [arg]
        return [(path, "must be one of " + ", ".join(str(o) for o in options) + got)]
    reasons = {
        "minimum": f"must be >= {arg}",
        "maximum": f"must be <= {arg}",
        "exclusiveMinimum": f"must be > {arg}",
        "exclusiveMaximum": f"must be < {arg}",
        "minItems": f"must have at least {arg} item(s)",
        "maxItems": f"must have at most {arg} item(s)",
        "minLength": "must not be empty",
        "pattern": f"must match {arg}",
    }
    if kind in reasons:
        return [(path, reasons[kind] + (got if kind.endswith(("imum",)) else ""))]
    return [(path, err.message)]


def problems(schema: dict, data: object) -> list[tuple[tuple, str]]:
    """Every (field path, reason) where data breaks schema, sorted by path, without repeats."""
    out: list[tuple[tuple, str]] = []
    for err in Validator(schema).iter_errors(data):
        for p in _reasons(err):
            if p not in out:
                out.append(p)
    return sorted(out, key=lambda p: ([(0, k) if isinstance(k, int) else (1, str(k)) for k in p[0]], p[1]))


def check(schema: dict, doc: Document | object) -> None:
    """Raise one ValueError naming file, line and field path of every problem (none: return)."""
    doc = document(doc)
    found = problems(schema, doc.data)
    if found:
        raise ValueError("; ".join(doc.message(path, reason) for path, reason in found))


def with_defaults(properties: dict, defaults: dict) -> dict:
    """properties with each default stated (JSON Schema's `default` annotation; it validates nothing)."""
    out = dict(properties)
    for k, value in defaults.items():
        if k in out:  # an integer field states an integer default (the CRD's schema requires it)
            out[k] = {**out[k], "default": int(value) if out[k].get("type") == "integer" else value}
    return out


def defaults_of(schema: dict) -> dict:
    """The default of each field of an object schema that states one, by field name."""
    return {k: v["default"] for k, v in schema.get("properties", {}).items() if "default" in v}
