"""CRD schemas as the API server applies them to custom resources: defaulting, pruning of unknown
fields, then OpenAPI v3 validation with errors that name the field path; and the checks a CRD's own
schema must pass (JSONSchemaProps' field types, structural rules)."""

from __future__ import annotations

import copy
import json
import re

PROPS_TYPES = {  # JSONSchemaProps fields and their JSON types (a wrong type fails decoding, as in Go)
    "id": str, "$schema": str, "$ref": str, "description": str, "type": str, "format": str, "title": str,
    "default": object, "maximum": (int, float), "exclusiveMaximum": bool, "minimum": (int, float),
    "exclusiveMinimum": bool, "maxLength": int, "minLength": int, "pattern": str, "maxItems": int,
    "minItems": int, "uniqueItems": bool, "multipleOf": (int, float), "enum": list, "maxProperties": int,
    "minProperties": int, "required": list, "items": (dict, list), "allOf": list, "oneOf": list,
    "anyOf": list, "not": dict, "properties": dict, "additionalProperties": (dict, bool),
    "patternProperties": dict, "dependencies": dict, "additionalItems": (dict, bool), "definitions": dict,
    "externalDocs": dict, "example": object, "nullable": bool,
    "x-kubernetes-preserve-unknown-fields": bool, "x-kubernetes-embedded-resource": bool,
    "x-kubernetes-int-or-string": bool, "x-kubernetes-list-map-keys": list, "x-kubernetes-list-type": str,
    "x-kubernetes-map-type": str, "x-kubernetes-validations": list,
}
GO_TYPES = {str: "string", bool: "bool", int: "int64", list: "[]", dict: "map"}
SCHEMA_KEYS = {"items", "not", "additionalProperties", "additionalItems"}
SCHEMA_LISTS = {"allOf", "oneOf", "anyOf"}
SCHEMA_MAPS = {"properties", "patternProperties", "definitions"}


def _go_type(expected) -> str:
    first = expected[0] if isinstance(expected, tuple) else expected
    return {float: "float64"}.get(first, GO_TYPES.get(first, "interface"))


def crd_schema_errors(node: dict, path: str, in_junctor: bool = False) -> list[str]:
    """Decoding and structural errors of a CRD's openAPIV3Schema (empty when the API server takes it)."""
    errors = []
    if not isinstance(node, dict):
        return [f"{path}: must be an object"]
    for key, value in node.items():
        expected = PROPS_TYPES.get(key)
        if expected is None:
            errors.append(f'{path}: unknown field "{key}"')
            continue
        if expected is object:
            continue
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in ((int, float), int))
        if not ok:
            name = type(value).__name__
            got = {"str": "string", "int": "number", "float": "number", "dict": "object", "list": "array"}
            got = got.get(name, name)
            errors.append(f"json: cannot unmarshal {got} into Go "
                          f"struct field JSONSchemaProps.{path}.{key} of type {_go_type(expected)}")
    if errors:
        return errors
    t = node.get("type")
    if node.get("x-kubernetes-int-or-string") and t:
        errors.append(f"{path}.type: Invalid value: must be empty when x-kubernetes-int-or-string is true")
    if not in_junctor and not t and not node.get("x-kubernetes-int-or-string") \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        errors.append(f"{path}.type: Required value: must not be empty for specified object fields")
    if in_junctor and (t or "properties" in node or "items" in node or "default" in node):
        errors.append(f"{path}: Forbidden: type, properties, items and default are forbidden inside "
                      f"allOf, anyOf, oneOf and not")
    if t == "array" and "items" not in node:
        errors.append(f"{path}.items: Required value: must be specified")
    if "properties" in node and isinstance(node.get("additionalProperties"), dict):
        errors.append(f"{path}.additionalProperties: Forbidden: additionalProperties and properties are "
                      f"mutual exclusive")
    if node.get("additionalProperties") is False:
        errors.append(f"{path}.additionalProperties: Forbidden: must not be false")
    for key in SCHEMA_KEYS & node.keys():
        if isinstance(node[key], dict):
            errors += crd_schema_errors(node[key], f"{path}.{key}", in_junctor)
    for key in SCHEMA_LISTS & node.keys():
        for i, sub in enumerate(node[key]):
            errors += crd_schema_errors(sub, f"{path}.{key}[{i}]", True)
    for key in SCHEMA_MAPS & node.keys():
        for name, sub in node[key].items():
            errors += crd_schema_errors(sub, f"{path}.{key}.{name}", in_junctor)
    return errors


# -- custom resources -------------------------------------------------------------------------------
def apply_defaults(schema: dict, value) -> None:
    """Fills `default`s in place, where the enclosing object exists (as the API server defaults)."""
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for v in value.values():
                apply_defaults(extra, v)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            apply_defaults(schema["items"], v)


def prune(schema: dict, value, path: str, root: bool = False) -> list[str]:
    """Drops fields the schema does not know (in place); returns their paths."""
    dropped = []
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        keep = {"apiVersion", "kind", "metadata"} if embedded else set()
        for name in list(value):
            if name in props or name in keep or isinstance(extra, dict) or extra is True:
                continue
            dropped.append(f"{path}.{name}" if path else name)
            del value[name]
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, v in value.items():
            sub = props.get(name) or (extra if isinstance(extra, dict) else None)
            if sub is not None and not (root and name == "metadata"):  # the server owns metadata
                dropped += prune(sub, v, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            dropped += prune(schema["items"], v, f"{path}[{i}]")
    return dropped


def _show(value) -> str:
    return json.dumps(value)


def _type_ok(t: str, value) -> bool:
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def validate(schema: dict, value, path: str) -> list[tuple[str, str]]:
    """(field path, message) for each violation, in the API server's words."""
    errors: list[tuple[str, str]] = []
    if value is None:
        if schema.get("nullable"):
            return errors
        if schema.get("type") or schema.get("x-kubernetes-int-or-string"):
            return [(path, f"Invalid value: \"null\": {path} in body must be of type "
                           f"{schema.get('type', 'integer,string')}: \"null\"")]
    t = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok("integer", value) or _type_ok("string", value)):
            return [(path, f"Invalid value: {_show(value)}: {path} in body must be of type integer,string: "
                           f"{_show(type(value).__name__)}")]
    elif t and not _type_ok(t, value):
        got = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object",
               "list": "array"}.get(type(value).__name__, type(value).__name__)
        return [(path, f"Invalid value: {_show(got)}: {path} in body must be of type {t}: {_show(got)}")]
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        errors.append((path, f"Unsupported value: {_show(value)}: supported values: {supported}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low, excl = schema["minimum"], schema.get("exclusiveMinimum", False)
            if value < low or (excl and value == low):
                word = "greater than" if excl else "greater than or equal to"
                errors.append((path, f"Invalid value: {_show(value)}: {path} in body should be {word} {low}"))
        if "maximum" in schema:
            high, excl = schema["maximum"], schema.get("exclusiveMaximum", False)
            if value > high or (excl and value == high):
                word = "less than" if excl else "less than or equal to"
                errors.append((path,
                               f"Invalid value: {_show(value)}: {path} in body should be {word} {high}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append((path, f"Invalid value: {_show(value)}: {path} in body should be at least "
                                 f"{schema['minLength']} chars long"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append((path, f"Too long: may not be longer than {schema['maxLength']}"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append((path, f"Invalid value: {_show(value)}: {path} in body should match "
                                 f"'{schema['pattern']}'"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append((path, f"Invalid value: {len(value)}: {path} in body should have at least "
                                 f"{schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(value):
                errors += validate(schema["items"], v, f"{path}[{i}]")
    if isinstance(value, dict):
        for name in schema.get("required") or []:
            if name not in value:
                errors.append((f"{path}.{name}" if path else name, "Required value"))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, v in value.items():
            sub = props.get(name) or (extra if isinstance(extra, dict) else None)
            if sub is not None and not (path == "" and name == "metadata"):
                errors += validate(sub, v, f"{path}.{name}" if path else name)
    for sub in schema.get("allOf") or []:
        errors += validate(sub, value, path)
    if "oneOf" in schema:
        ok = sum(1 for sub in schema["oneOf"] if not validate(sub, value, path))
        if ok != 1:
            found = "none" if ok == 0 else "more than one"
            errors.append((path,
                           f"Invalid value: {_show(value)}: {path or 'object'} in body must validate one "
                                 f"and only one schema (oneOf). Found {found} valid"))
    if "anyOf" in schema and not any(not validate(sub, value, path) for sub in schema["anyOf"]):
        errors.append((path, f"Invalid value: {_show(value)}: {path} in body must validate at least one "
                             f"schema (anyOf)"))
    if "not" in schema and not validate(schema["not"], value, path):
        errors.append((path,
                       f"Invalid value: {_show(value)}: {path} in body must not validate the schema (not)"))
    return errors
