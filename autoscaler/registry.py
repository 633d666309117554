"""Policy types, each declared once: a registration names the type, its class, its options and what it reads.

    @dataclass
    class ToyOptions:
        target: float = option("targetValue", 4.0, {"type": "number", "exclusiveMinimum": 0}, "per replica")

    register(PolicyType("toy", build=lambda spec, o, model: ToyPolicy(o.target), options=ToyOptions,
                        reads=("num_waiting",), meaning="a toy"))

Everything else is derived from the registrations: the schema's `spec.policy.type` enum and option
blocks (autoscaler.schema), the CRD, the reference page, the metric sources' reads and make_policy.
The built-in types register in autoscaler/policies/ (imported by autoscaler.schema); a new type is one
module that calls register() when imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

from autoscaler.observation import AGGREGATES
from autoscaler.validation import with_defaults

NAME = re.compile(r"^[a-z][A-Za-z0-9]*$")


def param_default(fn, name: str) -> object:
    """The default of a keyword of a function, class or dataclass (so it is written once, there)."""
    return inspect.signature(fn).parameters[name].default


def option(spec_name: str, default: object, schema: dict, meaning: str = "") -> object:
    """A field of a policy's options dataclass: its spec name, default, JSON Schema and one-line meaning."""
    metadata = {"spec": spec_name, "schema": schema, "meaning": meaning}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class PolicyType:
    name: str  # spec.policy.type, and the name of its option block spec.policy.<name>
    # (spec, options, latency_model) -> Policy; options: the options dataclass filled from the block
    # (or what `load` returned), latency_model: the caller's step-time model (None when it has none)
    build: Callable
    reads: tuple[str, ...]  # the Observation aggregates decide() reads (AGGREGATES); () = triggers only
    options: type | None = None  # a dataclass of option() fields
    needs_latency_model: bool = False
    needs_slo: bool = False  # spec.slo must name at least one target
    meaning: str = ""  # one line for the reference
    # a block that is not an options dataclass (KEDA's triggers): its schema, and
    # load(block_document, spec) -> the options object handed to build
    block_schema: dict | None = None
    block_required: bool = False
    load: Callable | None = None
    triggers: Callable | None = None  # options -> the extra triggers the policy reads (fast signals)
    # `slopilot export keda`: to_keda(spec, out_spec, server_address) fills the ScaledObject's spec and
    # returns notes on where it differs; None: no equivalent, for the reason no_keda gives
    to_keda: Callable | None = None
    no_keda: str = ""


_TYPES: dict[str, PolicyType] = {}


def register(pt: PolicyType) -> PolicyType:
    """Add a policy type (registering the same object again is a no-op); returns it."""
    if _TYPES.get(pt.name) is pt:
        return pt
    if pt.name in _TYPES:
        raise ValueError(f"policy type {pt.name!r} is registered already")
    if not NAME.match(pt.name):
        raise ValueError(f"policy type {pt.name!r}: a name is lowerCamelCase letters and digits")
    unknown = sorted(set(pt.reads) - set(AGGREGATES))
    if unknown:
        raise ValueError(f"policy type {pt.name}: reads unknown aggregates {unknown} (known: {AGGREGATES})")
    if (pt.options is None) == (pt.block_schema is None):
        raise ValueError(f"policy type {pt.name}: give options (a dataclass) or block_schema, not both")
    if pt.options is not None:
        for f in dataclasses.fields(pt.options):
            if "spec" not in f.metadata or f.default is dataclasses.MISSING:
                raise ValueError(f"policy type {pt.name}: option {f.name} is not declared with option()")
    _TYPES[pt.name] = pt
    return pt


def unregister(name: str) -> None:
    _TYPES.pop(name, None)


def registered() -> list[PolicyType]:
    """Every registered type, in registration order."""
    return list(_TYPES.values())


def lookup(name: str) -> PolicyType:
    try:
        return _TYPES[name]
    except KeyError:
        raise ValueError(f"spec.policy.type: unknown policy {name!r} "
                         f"(registered: {', '.join(_TYPES)})") from None


def option_fields(pt: PolicyType) -> list:
    return list(dataclasses.fields(pt.options)) if pt.options is not None else []


def block_schema(pt: PolicyType) -> dict:
    """The JSON Schema of spec.policy.<name>, each default stated."""
    if pt.block_schema is not None:
        return pt.block_schema
    fields = option_fields(pt)
    props = with_defaults({f.metadata["spec"]: f.metadata["schema"] for f in fields},
                          {f.metadata["spec"]: f.default for f in fields})
    return {"type": "object", "additionalProperties": False, "properties": props}


def load_options(pt: PolicyType, block: dict) -> object:
    """The options dataclass from a validated block: the options it sets, the declared defaults else."""
    given = {f.name: block[f.metadata["spec"]] for f in option_fields(pt) if f.metadata["spec"] in block}
    return pt.options(**given)


def meanings(prefix: str = "spec.policy") -> dict[str, str]:
    """Field path -> the one-line meaning each registration gives, for the reference page."""
    names = list(_TYPES)
    out = {f"{prefix}.type": "which policy decides: " + ", ".join(names[:-1]) + " or " + names[-1]}
    for pt in _TYPES.values():
        if pt.meaning:
            out[f"{prefix}.{pt.name}"] = pt.meaning
        for f in option_fields(pt):
            if f.metadata.get("meaning"):
                out[f"{prefix}.{pt.name}.{f.metadata['spec']}"] = f.metadata["meaning"]
    return out
