"""Builds the controller's loops from loaded specs: a policy, a metric source and a target for each.

Shared by `slopilot control` and `slopilot fleet up`; the caller says where metrics come from (a
Prometheus URL, or engine endpoints to scrape) and hands a target per spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autoscaler.spec import Spec, make_policy
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog
from controlplane.sources import PrometheusSource, ScrapeSource
from controlplane.sources.prometheus import raw_triggers, resolve_trigger_authentication
from controlplane.specs import Loaded
from controlplane.state import StateStore
from controlplane.telemetry import Telemetry


def trigger_auth(spec: Spec, loaded: Loaded) -> dict[str, dict]:
    """Trigger name -> resolved TriggerAuthentication parameters, for triggers that reference one."""
    out = {}
    for name, raw in raw_triggers(spec).items():
        ref = (raw or {}).get("authenticationRef") or {}
        if not ref:
            continue
        doc = loaded.trigger_auths.get(ref.get("name"))
        if doc is None:
            raise ValueError(f"{spec.name}: trigger {name!r} references TriggerAuthentication "
                             f"{ref.get('name')!r}, which no --spec file defines")
        out[name] = resolve_trigger_authentication(doc, loaded.secrets)
    return out


def source_for(spec: Spec, loaded: Loaded, prometheus: str | None, scrape, engine: str, timeout: float):
    """A ScrapeSource over `scrape` (endpoints, or a callable returning them) when given, else a
    PrometheusSource (`prometheus` overrides each trigger's serverAddress when given)."""
    if scrape is not None:
        return ScrapeSource(scrape, engine=engine, timeout=timeout)
    default = next((t.server_address for t in spec.triggers if getattr(t, "server_address", None)), None)
    url = prometheus or default
    if not url:
        raise ValueError(f"{spec.name}: no Prometheus to ask: give --prometheus URL (or --scrape) or a "
                         f"trigger serverAddress")
    return PrometheusSource(url, engine="vllm" if engine == "auto" else engine, timeout=timeout,
                            trigger_auth=trigger_auth(spec, loaded), override=prometheus is not None)


def log_path(template: str | None, name: str, several: bool) -> Path | None:
    if template is None:
        return None
    if several and "{name}" not in template:
        raise ValueError(f"--decision-log {template}: several autoscalers run, so the path must contain "
                         f"{{name}} (one log per autoscaler, each replayable with its own spec)")
    return Path(template.format(name=name))


def build_loops(loaded: Loaded, target_for: Callable[[Spec], object],
                source_for_spec: Callable[[Spec], object], latency_model=None,
                state_dir: str | None = None, decision_log: str | None = None,
                telemetry: Telemetry | None = None) -> list[AutoscalerLoop]:
    state = StateStore(state_dir) if state_dir else None
    several = len(loaded.specs) > 1
    loops = []
    for spec, path in loaded.specs:
        if spec.needs_latency_model and latency_model is None:
            raise ValueError(f"{path}: {spec.name} is an {spec.policy_type} policy: give --latency-model "
                             f"(a shipped model name or a calibrated JSON)")
        policy = make_policy(spec, latency_model=latency_model)
        lp = log_path(decision_log, spec.name, several)
        log_file = DecisionLog(lp, [t.name for t in spec.triggers]) if lp else None
        loops.append(AutoscalerLoop(spec, policy, source_for_spec(spec), target_for(spec), state, log_file,
                                    telemetry))
    return loops
