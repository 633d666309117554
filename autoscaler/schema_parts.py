"""Building blocks of our JSON Schemas (checked by autoscaler.validation): the common number and
string types, bounds, and a closed mapping. Scenario, plan, fleet, router and load-generator schemas
are written with them."""

from __future__ import annotations

STR = {"type": "string"}
BOOL = {"type": "boolean"}
NONNEG = {"type": "number", "minimum": 0}
POS = {"type": "number", "exclusiveMinimum": 0}
FRACTION = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
COUNT0 = {"type": "integer", "minimum": 0}
COUNT1 = {"type": "integer", "minimum": 1}


def at_most(schema: dict, limit: float) -> dict:
    """The schema with an upper limit ."""
    return {**schema, "maximum": limit}


def at_least(schema: dict, limit: float) -> dict:
    """The schema with `limit` as its (inclusive) lower bound."""
    rest = {k: v for k, v in schema.items() if k not in ("minimum", "exclusiveMinimum")}
    return {**rest, "minimum": limit}


def mapping(properties: dict, required: tuple = (), **extra) -> dict:
    """An object with exactly these keys (`required` among them)."""
    out = {"type": "object", "additionalProperties": False, "properties": properties, **extra}
    if required:
        out["required"] = list(required)
    return out
