"""Policy specs: load a KEDA ScaledObject or an InferenceAutoscaler, and build its Policy.

    spec = load_spec(yaml_text_or_dict)          # validated by autoscaler.schema, with defaults
    policy = make_policy(spec, latency_model=m)  # m: any object with step_ms(...) (sloModel only)

Defaults are KEDA's for ScaledObjects (min 0, max 100, polling 30 s, cooldown 300 s) and ours for the
InferenceAutoscaler (min 1, polling 15 s, startup delay 120 s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from autoscaler import hpa
from autoscaler.expr import Formula
from autoscaler.keda import Fallback, KedaConfig, KedaPolicy, ScalingModifiers, Trigger
from autoscaler.kpa import KpaPolicy, KpaSpec
from autoscaler.policy import Policy
from autoscaler.ratio import RatioPolicy, SloTarget
from autoscaler.schema import IA_API_VERSION, validate
from autoscaler.slo_model import SloModelPolicy, StepTimeModel


@dataclass
class Spec:
    kind: str  # "ScaledObject" or "InferenceAutoscaler"
    name: str
    target: str  # scaleTargetRef.name
    policy_type: str  # keda, hpa, ratio, sloModel, kpa
    min_replicas: int
    max_replicas: int
    polling_interval: float
    startup_delay: float = 120.0
    slos: list[SloTarget] = field(default_factory=list)
    keda: KedaConfig | None = None  # keda and hpa policies
    options: dict = field(default_factory=dict)  # the policy's own block (ratio, sloModel, kpa)
    doc: dict = field(default_factory=dict)  # the validated document

    @property
    def triggers(self) -> list[Trigger]:
        return self.keda.triggers if self.keda else []


def _bool(v, default: bool) -> bool:
    if v is None:
        return default
    return v if isinstance(v, bool) else str(v).lower() == "true"


def _triggers(raw: list[dict], path: str) -> list[Trigger]:
    out, seen = [], set()
    for i, t in enumerate(raw):
        md = t["metadata"]
        name = t.get("name") or f"s{i}"
        if name in seen:
            raise ValueError(f"{path}[{i}].name: duplicate trigger name {name!r}")
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
            raise ValueError(f"{path}[{i}].metadata.threshold: must be > 0")
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


def _keda_config(
    block: dict, path: str, min_r: int, max_r: int, polling: float, activation: bool
) -> KedaConfig:
    triggers = _triggers(block["triggers"], f"{path}.triggers")
    adv = block.get("advanced", {})
    behavior = _behavior(
        adv.get("horizontalPodAutoscalerConfig", {}).get("behavior") or block.get("behavior")
    )
    mods = None
    if "scalingModifiers" in adv:
        m = adv["scalingModifiers"]
        mp = f"{path}.advanced.scalingModifiers"
        try:
            formula = Formula(m["formula"])
        except ValueError as exc:
            raise ValueError(f"{mp}.formula: {exc}") from None
        unknown = sorted(formula.names - {t.name for t in triggers})
        if unknown:
            raise ValueError(
                f"{mp}.formula: unknown trigger name(s) {', '.join(unknown)} "
                f"(triggers: {', '.join(t.name for t in triggers)})"
            )
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
        raise ValueError(f"{path}.idleReplicaCount: must be less than minReplicaCount ({min_r})")
    return KedaConfig(
        triggers=triggers,
        min_replica_count=min_r,
        max_replica_count=max_r,
        polling_interval=polling,
        cooldown_period=block.get("cooldownPeriod", 300),
        initial_cooldown_period=block.get("initialCooldownPeriod", 0),
        idle_replica_count=idle,
        fallback=fb,
        behavior=behavior,
        modifiers=mods,
        tolerance=_tolerances(behavior, float(block.get("tolerance", hpa.DEFAULT_TOLERANCE))),
        activation=activation,
    )


def load_spec(source: str | dict) -> Spec:
    """Parse YAML text (or an already-parsed dict), validate it against the one schema, fill defaults."""
    if isinstance(source, str):
        try:
            doc = yaml.safe_load(source)
        except yaml.YAMLError as exc:
            raise ValueError(f"spec: not valid YAML: {exc}") from None
    else:
        doc = source
    validate(doc)
    s = doc["spec"]
    name, target = doc["metadata"]["name"], s["scaleTargetRef"]["name"]
    if doc["kind"] == "ScaledObject":
        min_r, max_r = s.get("minReplicaCount", 0), s.get("maxReplicaCount", 100)
        if min_r > max_r:
            raise ValueError("spec.minReplicaCount: must be <= maxReplicaCount")
        polling = float(s.get("pollingInterval", 30))
        cfg = _keda_config(s, "spec", min_r, max_r, polling, activation=True)
        return Spec("ScaledObject", name, target, "keda", min_r, max_r, polling, keda=cfg, doc=doc)

    min_r, max_r = s.get("minReplicas", 1), s["maxReplicas"]
    if min_r > max_r:
        raise ValueError("spec.minReplicas: must be <= maxReplicas")
    polling = float(s.get("pollingInterval", 15))
    slos = [
        SloTarget(m, float(v.get("percentile", 90)), float(v["seconds"])) for m, v in s.get("slo", {}).items()
    ]
    pol = s["policy"]
    ptype = pol["type"]
    block = pol.get(ptype)
    if block is None and ptype in ("keda", "hpa"):
        raise ValueError(f"spec.policy.{ptype}: is required when spec.policy.type is {ptype}")
    if ptype in ("ratio", "sloModel") and not slos:
        raise ValueError(f"spec.slo: is required for the {ptype} policy (ttft and/or tpot)")
    spec = Spec(
        "InferenceAutoscaler",
        name,
        target,
        ptype,
        min_r,
        max_r,
        polling,
        float(s.get("startupDelaySeconds", 120)),
        slos,
        options=block or {},
        doc=doc,
    )
    if ptype in ("keda", "hpa"):
        spec.keda = _keda_config(
            block, f"spec.policy.{ptype}", min_r, max_r, polling, activation=ptype == "keda"
        )
    return spec


def make_policy(spec: Spec, latency_model: StepTimeModel | None = None) -> Policy:
    """The Policy a spec describes; latency_model is required for sloModel only."""
    o = spec.options
    common = dict(
        min_replicas=spec.min_replicas, max_replicas=spec.max_replicas, polling_interval=spec.polling_interval
    )
    if spec.policy_type in ("keda", "hpa"):
        return KedaPolicy(spec.keda)
    if spec.policy_type == "ratio":
        return RatioPolicy(
            spec.slos,
            up=o.get("scaleUpThreshold", 0.55),
            down=o.get("scaleDownThreshold", 0.40),
            clamp=o.get("clamp", 2.0),
            window=o.get("windowSeconds", 45.0),
            **common,
        )
    if spec.policy_type == "sloModel":
        return SloModelPolicy(
            spec.slos,
            latency_model,
            startup_delay=spec.startup_delay,
            margin=o.get("margin", 0.15),
            forecast_window=o.get("forecastWindowSeconds", 300.0),
            scale_down_delay=o.get("scaleDownDelaySeconds", 180.0),
            max_batch_seqs=o.get("maxBatchSeqs", 256),
            prompt_cv=o.get("promptCV", 1.0),
            drain_seconds=o.get("drainSeconds", 60.0),
            trend_window=o.get("trendWindowSeconds", 60.0),
            burst_rise=o.get("burstRise", 0.2),
            burst_z=o.get("burstZ", 4.0),
            burst_slope=o.get("burstSlope", "trend"),
            drop_on_fall=o.get("dropOnFall", False),
            **common,
        )
    if spec.policy_type == "kpa":
        stable = float(o.get("stableWindowSeconds", 60))
        target = float(o.get("target", 100)) * float(o.get("targetUtilization", 0.7))
        kspec = KpaSpec(
            target_value=target,
            max_scale_up_rate=o.get("maxScaleUpRate", 1000.0),
            max_scale_down_rate=o.get("maxScaleDownRate", 2.0),
            panic_threshold=o.get("panicThresholdPercentage", 200.0) / 100.0,
            stable_window=stable,
            panic_window=stable * o.get("panicWindowPercentage", 10.0) / 100.0,
            scale_down_delay=o.get("scaleDownDelaySeconds", 0.0),
        )
        return KpaPolicy(kspec, o.get("metric", "concurrency"), **common)
    raise ValueError(f"spec.policy.type: unknown policy {spec.policy_type!r}")


__all__ = ["IA_API_VERSION", "Spec", "load_spec", "make_policy"]
