"""The keda and hpa policy types: KEDA's ScaledObject semantics, and a plain HPA on the same triggers.

The option block is KEDA's own (autoscaler.keda_schema), parsed here into a KedaConfig; a ScaledObject's
spec is parsed by the same keda_config().
"""

from __future__ import annotations

import copy

from autoscaler import hpa_behavior, hpa_replicas
from autoscaler.expr import Formula
from autoscaler.hpa_behavior import ScalingPolicy
from autoscaler.keda import Fallback, KedaConfig, KedaPolicy, ScalingModifiers, Trigger
from autoscaler.keda_schema import BEHAVIOR, KEDA_FIELDS, NUM, TRIGGERS
from autoscaler.registry import PolicyType, register
from autoscaler.series import RESERVED_NAMES
from autoscaler.yamlfile import Document


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
        if name in RESERVED_NAMES:
            raise doc.error((i, "name"), f"{name!r} is reserved: the decision log and replay series have a "
                                         f"column of that name; reserved names: {', '.join(RESERVED_NAMES)}")
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


def _rules(raw: dict | None) -> hpa_behavior.ScalingRules | None:
    if raw is None:
        return None
    return hpa_behavior.ScalingRules(
        raw.get("stabilizationWindowSeconds"),
        raw.get("selectPolicy", "Max"),
        [ScalingPolicy(p["type"], p["value"], p["periodSeconds"]) for p in raw.get("policies", [])],
        float(raw["tolerance"]) if "tolerance" in raw else None,
    )


def _behavior(raw: dict | None) -> hpa_behavior.Behavior | None:
    if raw is None:
        return None
    return hpa_behavior.default_behavior(_rules(raw.get("scaleUp")), _rules(raw.get("scaleDown")))


def _tolerances(behavior: hpa_behavior.Behavior | None, default: float) -> hpa_replicas.Tolerances:
    down = up = default
    if behavior is not None:
        up = behavior.scale_up.tolerance if behavior.scale_up.tolerance is not None else default
        down = behavior.scale_down.tolerance if behavior.scale_down.tolerance is not None else default
    return hpa_replicas.Tolerances(down=down, up=up)


def keda_config(doc: Document, min_r: int, max_r: int, polling: float, activation: bool) -> KedaConfig:
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
        tolerance=_tolerances(behavior, float(block.get("tolerance", hpa_replicas.DEFAULT_TOLERANCE))),
        activation=activation,
        **_keywords({k: v for k, v in block.items() if k in cooldowns}, cooldowns),
    )


def _keywords(options: dict, names: dict[str, str]) -> dict:
    return {names[k]: v for k, v in options.items()}


def _build(spec, config: KedaConfig, latency_model) -> KedaPolicy:
    return KedaPolicy(config)


def _loader(activation: bool):
    def load(block: Document, spec) -> KedaConfig:
        return keda_config(block, spec.min_replicas, spec.max_replicas, spec.polling_interval, activation)

    return load


def keda_to_keda(spec, out_spec: dict, server_address: str) -> list[str]:
    """The same triggers and options, verbatim."""
    out_spec.update(copy.deepcopy(spec.options))
    return []


def hpa_to_keda(spec, out_spec: dict, server_address: str) -> list[str]:
    """A ScaledObject that never deactivates (minReplicaCount >= 1) with the HPA behavior."""
    block, notes = copy.deepcopy(spec.options), []
    if spec.min_replicas < 1:
        notes.append("minReplicaCount raised to 1: the hpa policy never scales to zero")
        out_spec["minReplicaCount"] = 1
    out_spec["triggers"] = block["triggers"]
    behavior = block.get("behavior")
    if "tolerance" in block:
        behavior = copy.deepcopy(behavior or {})
        for side in ("scaleUp", "scaleDown"):
            behavior.setdefault(side, {}).setdefault("tolerance", str(block["tolerance"]))
        notes.append(
            "tolerance moved to behavior.scaleUp/scaleDown.tolerance (Kubernetes >= 1.33, "
            "feature gate HPAConfigurableTolerance)"
        )
    if behavior:
        out_spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
    return notes


KEDA = register(PolicyType(
    "keda", _build, reads=(), block_required=True, load=_loader(True), triggers=lambda c: c.triggers,
    to_keda=keda_to_keda,
    meaning="KEDA semantics (triggers, activation, cooldown, fallback, scalingModifiers)",
    block_schema={"type": "object", "required": ["triggers"], "additionalProperties": False,
                  "properties": KEDA_FIELDS},
))
HPA = register(PolicyType(
    "hpa", _build, reads=(), block_required=True, load=_loader(False), triggers=lambda c: c.triggers,
    to_keda=hpa_to_keda,
    meaning="a plain HPA on the same triggers (no scale to zero)",
    block_schema={"type": "object", "required": ["triggers"], "additionalProperties": False,
                  "properties": {"triggers": TRIGGERS, "behavior": BEHAVIOR, "tolerance": NUM}},
))
