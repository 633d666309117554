"""Policy specs: load a KEDA ScaledObject or an InferenceAutoscaler, and build its Policy.

    spec = load_spec(text, path="x.yaml")        # validated by autoscaler.schema, with defaults
    policy = make_policy(spec, latency_model=m)  # m: any object with step_ms(...) (sloModel only)

Defaults are the ones the schema states: KEDA's for ScaledObjects (min 0, max 100, polling 30 s,
cooldown 300 s), ours for the InferenceAutoscaler (min 1, polling 15 s); a policy's options default
to its class's keyword defaults. Errors name the file (when given), the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.keda import KedaConfig
from autoscaler.policies.keda import keda_config
from autoscaler.policy import Policy
from autoscaler.registry import PolicyType, load_options, lookup
from autoscaler.schema import (
    IA_API_VERSION,
    SCALED_OBJECT,
    defaults_of,
    inference_autoscaler,
    validate,
)
from autoscaler.slo import SloTarget
from autoscaler.slo_model import StepTimeModel
from autoscaler.yamlfile import Document, document, parse

SO_DEFAULTS = defaults_of(SCALED_OBJECT["properties"]["spec"])
IA_DEFAULTS = defaults_of(inference_autoscaler()["properties"]["spec"])


@dataclass
class Spec:
    kind: str  # "ScaledObject" or "InferenceAutoscaler"
    name: str
    target: str  # scaleTargetRef.name
    policy_type: str  # a registered policy type (autoscaler.registry): keda, hpa, ratio, sloModel, kpa, ...
    min_replicas: int
    max_replicas: int
    polling_interval: float
    startup_delay: float = IA_DEFAULTS["startupDelaySeconds"]  # InferenceAutoscaler only
    slos: list[SloTarget] = field(default_factory=list)
    config: object = None  # the policy's options, loaded from its block (a KedaConfig for keda and hpa)
    options: dict = field(default_factory=dict)  # the policy's own block as written
    doc: dict = field(default_factory=dict)  # the validated document

    @property
    def type(self) -> PolicyType:
        return lookup(self.policy_type)

    @property
    def keda(self) -> KedaConfig | None:
        return self.config if isinstance(self.config, KedaConfig) else None

    @property
    def triggers(self) -> list:
        hook = self.type.triggers
        return hook(self.config) if hook is not None else []

    @property
    def needs_latency_model(self) -> bool:
        return self.type.needs_latency_model


def load_spec(source: str | dict | Document, path: str | None = None) -> Spec:
    """A spec from YAML text, parsed data or a Document: validated against the one schema, defaults
    filled. path names the file in error messages (the caller reads it; nothing here opens files)."""
    if isinstance(source, str):
        doc = parse(source, path)
    else:
        doc = document(source, path)
    validate(doc)
    d = doc.data
    s = d["spec"]
    sdoc = doc.at("spec")
    name, target = d["metadata"]["name"], s["scaleTargetRef"]["name"]
    if d["kind"] == "ScaledObject":
        min_r = s.get("minReplicaCount", SO_DEFAULTS["minReplicaCount"])
        max_r = s.get("maxReplicaCount", SO_DEFAULTS["maxReplicaCount"])
        if min_r > max_r:
            raise sdoc.error(("minReplicaCount",), "must be <= maxReplicaCount")
        polling = float(s.get("pollingInterval", SO_DEFAULTS["pollingInterval"]))
        cfg = keda_config(sdoc, min_r, max_r, polling, activation=True)
        return Spec("ScaledObject", name, target, "keda", min_r, max_r, polling, config=cfg, doc=d)

    min_r, max_r = s.get("minReplicas", IA_DEFAULTS["minReplicas"]), s["maxReplicas"]
    if min_r > max_r:
        raise sdoc.error(("minReplicas",), "must be <= maxReplicas")
    polling = float(s.get("pollingInterval", IA_DEFAULTS["pollingInterval"]))
    slos = [SloTarget.from_yaml(m, v) for m, v in s.get("slo", {}).items()]
    pol = s["policy"]
    ptype = pol["type"]
    pt = lookup(ptype)
    block = pol.get(ptype)
    if block is None and pt.block_required:
        raise sdoc.error(("policy", ptype), f"is required when spec.policy.type is {ptype}")
    if pt.needs_slo and not slos:
        raise sdoc.error(("slo",), f"is required for the {ptype} policy (ttft and/or tpot)")
    spec = Spec(
        "InferenceAutoscaler",
        name,
        target,
        ptype,
        min_r,
        max_r,
        polling,
        float(s.get("startupDelaySeconds", IA_DEFAULTS["startupDelaySeconds"])),
        slos,
        options=block or {},
        doc=d,
    )
    if pt.load is not None:
        spec.config = pt.load(sdoc.at("policy", ptype), spec)
    else:
        spec.config = load_options(pt, spec.options)
    return spec


def make_policy(spec: Spec, latency_model: StepTimeModel | None = None) -> Policy:
    """The Policy a spec describes, built by its registered type; latency_model is needed by the types
    that declare it (spec.needs_latency_model: sloModel)."""
    pt = spec.type
    if pt.needs_latency_model and latency_model is None:
        raise ValueError(f"spec.policy.{pt.name}: needs a latency model (pass latency_model=...)")
    return pt.build(spec, spec.config, latency_model)


__all__ = ["IA_API_VERSION", "Spec", "load_spec", "make_policy"]
