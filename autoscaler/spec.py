"""Policy specs: load a KEDA ScaledObject or an InferenceAutoscaler, and build its Policy.

    spec = load_spec(text, path="x.yaml")        # validated by autoscaler.schema, with defaults
    policy = make_policy(spec, latency_model=m)  # m: any object with step_ms(...) (sloModel only)

Defaults are the ones the schema states: KEDA's for ScaledObjects (min 0, max 100, polling 30 s,
cooldown 300 s), ours for the InferenceAutoscaler (min 1, polling 15 s); a policy's options default
to its class's keyword defaults. Errors name the file (when given), the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler import hpa
from autoscaler.expr import Formula
from autoscaler.keda import Fallback, KedaConfig, KedaPolicy, ScalingModifiers, Trigger
from autoscaler.kpa import KpaPolicy, KpaSpec
from autoscaler.options import KPA_DEFAULTS, RATIO_OPTIONS, SLO_MODEL_OPTIONS
from autoscaler.policy import Policy
from autoscaler.ratio import RatioPolicy
from autoscaler.schema import (
    IA_API_VERSION,
    INFERENCE_AUTOSCALER,
    SCALED_OBJECT,
    defaults_of,
    validate,
)
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy, StepTimeModel, signal_triggers
from autoscaler.yamlfile import Document, document, parse

SO_DEFAULTS = defaults_of(SCALED_OBJECT["properties"]["spec"])
IA_DEFAULTS = defaults_of(INFERENCE_AUTOSCALER["properties"]["spec"])


@dataclass
class Spec:
    kind: str  # "ScaledObject" or "InferenceAutoscaler"
    name: str
    target: str  # scaleTargetRef.name
    policy_type: str  # keda, hpa, ratio, sloModel, kpa
    min_replicas: int
    max_replicas: int
    polling_interval: float
    startup_delay: float = IA_DEFAULTS["startupDelaySeconds"]  # InferenceAutoscaler only
    slos: list[SloTarget] = field(default_factory=list)
    keda: KedaConfig | None = None  # keda and hpa policies
    options: dict = field(default_factory=dict)  # the policy's own block (ratio, sloModel, kpa)
    doc: dict = field(default_factory=dict)  # the validated document

    @property
    def triggers(self) -> list[Trigger]:
        if self.keda:
            return self.keda.triggers
        return signal_triggers(self.options) if self.policy_type == "sloModel" else []


def _bool(v, default: bool) -> bool:
    if v is None:
        return default
    return v if isinstance(v, bool) else str(v).lower() == "true"


def _triggers(doc: Document) -> list[Trigger]:
    out, seen = [], set()
    for i, t in enumerate(doc.data):
        md = t["metadata"]
        name = t.get("name") or f"s{i}"
        if name in seen:
            raise doc.error((i, "name"), f"duplicate trigger name {name!r}")
        seen.add(name)
        out.append(
            Trigger(
                name=name,
                query=md["query"],
                threshold=float(md["threshold"]),
                activation_threshold=float(md.get("activationThreshold", 0)),
                metric_type=t.get("metricType", "AverageValue"),
                ignore_null_values=_bool(md.get("ignoreNullValues"), True),
                server_address=md.get("serverAddress", ""),
            )
        )
        if out[-1].threshold <= 0:
            raise doc.error((i, "metadata", "threshold"), "must be > 0")
    return out


def _rules(raw: dict | None) -> hpa.ScalingRules | None:
    if raw is None:
        return None
    return hpa.ScalingRules(
        raw.get("stabilizationWindowSeconds"),
        raw.get("selectPolicy", "Max"),
        [hpa.ScalingPolicy(p["type"], p["value"], p["periodSeconds"]) for p in raw.get("policies", [])],
        float(raw["tolerance"]) if "tolerance" in raw else None,
    )


def _behavior(raw: dict | None) -> hpa.Behavior | None:
    if raw is None:
        return None
    return hpa.default_behavior(_rules(raw.get("scaleUp")), _rules(raw.get("scaleDown")))


def _tolerances(behavior: hpa.Behavior | None, default: float) -> hpa.Tolerances:
    down = up = default
    if behavior is not None:
        up = behavior.scale_up.tolerance if behavior.scale_up.tolerance is not None else default
        down = behavior.scale_down.tolerance if behavior.scale_down.tolerance is not None else default
    return hpa.Tolerances(down=down, up=up)


def _keda_config(doc: Document, min_r: int, max_r: int, polling: float, activation: bool) -> KedaConfig:
    block = doc.data
    triggers = _triggers(doc.at("triggers"))
    adv = block.get("advanced", {})
    behavior = _behavior(
        adv.get("horizontalPodAutoscalerConfig", {}).get("behavior") or block.get("behavior")
    )
    mods = None
    if "scalingModifiers" in adv:
        m = adv["scalingModifiers"]
        where = ("advanced", "scalingModifiers", "formula")
        try:
            formula = Formula(m["formula"])
        except ValueError as exc:
            raise doc.error(where, str(exc)) from None
        unknown = sorted(formula.names - {t.name for t in triggers})
        if unknown:
            names = ", ".join(t.name for t in triggers)
            raise doc.error(where, f"unknown trigger name(s) {', '.join(unknown)} (triggers: {names})")
        mods = ScalingModifiers(
            m["formula"],
            float(m["target"]),
            float(m.get("activationTarget", 0)),
            m.get("metricType", "AverageValue"),
        )
    fb = None
    if "fallback" in block:
        f = block["fallback"]
        fb = Fallback(f["failureThreshold"], f["replicas"], f.get("behavior", "static"))
    idle = block.get("idleReplicaCount")
    if idle is not None and idle >= min_r:
        raise doc.error(("idleReplicaCount",), f"must be less than minReplicaCount ({min_r})")
    cooldowns = {"cooldownPeriod": "cooldown_period", "initialCooldownPeriod": "initial_cooldown_period"}
    return KedaConfig(
        triggers=triggers,
        min_replica_count=min_r,
        max_replica_count=max_r,
        polling_interval=polling,
        idle_replica_count=idle,
        fallback=fb,
        behavior=behavior,
        modifiers=mods,
        tolerance=_tolerances(behavior, float(block.get("tolerance", hpa.DEFAULT_TOLERANCE))),
        activation=activation,
        **_keywords({k: v for k, v in block.items() if k in cooldowns}, cooldowns),
    )


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
        cfg = _keda_config(sdoc, min_r, max_r, polling, activation=True)
        return Spec("ScaledObject", name, target, "keda", min_r, max_r, polling, keda=cfg, doc=d)

    min_r, max_r = s.get("minReplicas", IA_DEFAULTS["minReplicas"]), s["maxReplicas"]
    if min_r > max_r:
        raise sdoc.error(("minReplicas",), "must be <= maxReplicas")
    polling = float(s.get("pollingInterval", IA_DEFAULTS["pollingInterval"]))
    slos = [SloTarget.from_yaml(m, v) for m, v in s.get("slo", {}).items()]
    pol = s["policy"]
    ptype = pol["type"]
    block = pol.get(ptype)
    if block is None and ptype in ("keda", "hpa"):
        raise sdoc.error(("policy", ptype), f"is required when spec.policy.type is {ptype}")
    if ptype in ("ratio", "sloModel") and not slos:
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
    if ptype in ("keda", "hpa"):
        spec.keda = _keda_config(sdoc.at("policy", ptype), min_r, max_r, polling, activation=ptype == "keda")
    return spec


def _keywords(options: dict, names: dict[str, str]) -> dict:
    """The options a spec sets, under the policy's keyword names (the class holds the defaults)."""
    return {names[k]: v for k, v in options.items()}


def make_policy(spec: Spec, latency_model: StepTimeModel | None = None) -> Policy:
    """The Policy a spec describes; latency_model is required for sloModel only."""
    common = dict(
        min_replicas=spec.min_replicas, max_replicas=spec.max_replicas, polling_interval=spec.polling_interval
    )
    if spec.policy_type in ("keda", "hpa"):
        return KedaPolicy(spec.keda)
    if spec.policy_type == "ratio":
        return RatioPolicy(spec.slos, **_keywords(spec.options, RATIO_OPTIONS), **common)
    if spec.policy_type == "sloModel":
        return SloModelPolicy(
            spec.slos,
            latency_model,
            startup_delay=spec.startup_delay,
            **_keywords(spec.options, SLO_MODEL_OPTIONS),
            **common,
        )
    if spec.policy_type == "kpa":  # Knative's percentages, turned into KpaSpec's fractions
        o = {**KPA_DEFAULTS, **spec.options}
        stable = float(o["stableWindowSeconds"])
        kspec = KpaSpec(
            target_value=float(o["target"]) * float(o["targetUtilization"]),
            max_scale_up_rate=o["maxScaleUpRate"],
            max_scale_down_rate=o["maxScaleDownRate"],
            panic_threshold=o["panicThresholdPercentage"] / 100.0,
            stable_window=stable,
            panic_window=stable * o["panicWindowPercentage"] / 100.0,
            scale_down_delay=o["scaleDownDelaySeconds"],
        )
        return KpaPolicy(kspec, o["metric"], **common)
    raise ValueError(f"spec.policy.type: unknown policy {spec.policy_type!r}")


__all__ = ["IA_API_VERSION", "Spec", "load_spec", "make_policy"]
