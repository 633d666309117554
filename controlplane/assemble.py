"""Builds one autoscaler's loop: its policy, target, metric source and decision log.

The one build_loop of `slopilot control`, the Kubernetes controller (with its KubeLoop) and `slopilot
fleet up`; the settings (where metrics come from, the decision log, timeouts) are a ControllerArgs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autoscaler.spec import Spec, make_policy
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog
from controlplane.settings import ControllerArgs
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


def source_for(spec: Spec, settings: ControllerArgs, loaded: Loaded | None = None):
    """A ScrapeSource over settings.scrape (endpoints, or a callable returning them) when given, else a
    PrometheusSource (settings.prometheus overrides each trigger's serverAddress when given)."""
    if settings.scrape is not None:
        return ScrapeSource(settings.scrape, engine=settings.engine, timeout=settings.timeout,
                            window=settings.window)
    default = next((t.server_address for t in spec.triggers if getattr(t, "server_address", None)), None)
    url = settings.prometheus or default
    if not url:
        raise ValueError(f"{spec.name}: no Prometheus to ask: give --prometheus URL (or --scrape) or a "
                         f"trigger serverAddress")
    engine = "vllm" if settings.engine == "auto" else settings.engine
    return PrometheusSource(url, engine=engine, timeout=settings.timeout, window=settings.window,
                            trigger_auth=trigger_auth(spec, loaded or Loaded()),
                            override=settings.prometheus is not None)


def log_path(template: str | None, name: str, several: bool) -> Path | None:
    if template is None:
        return None
    if several and "{name}" not in template:
        raise ValueError(f"--decision-log {template}: several autoscalers run, so the path must contain "
                         f"{{name}} (one log per autoscaler, each replayable with its own spec)")
    return Path(template.format(name=name))


def build_loop(spec: Spec, settings: ControllerArgs, target_for: Callable[[Spec], object],
               source_for_spec: Callable[[Spec, object], object], latency_model=None, *, where: str = "",
               several: bool = False, log_name: str | None = None, state: StateStore | None = None,
               telemetry: Telemetry | None = None, make: Callable | None = None) -> AutoscalerLoop:
    """One autoscaler's loop. The policy comes first (a type that needs a latency model is refused
    without one, before any source starts), then target_for(spec), source_for_spec(spec, target) and
    the decision log (settings.decision_log with {name} = log_name, default the spec's name).
    make(policy, source, target, log_file) builds a loop of another class (the KubeLoop); else an
    AutoscalerLoop with `state`."""
    if spec.needs_latency_model and latency_model is None:
        raise ValueError(f"{where}: {spec.name} is an {spec.policy_type} policy: it needs the engines' "
                         f"step-time model: give --latency-model (a shipped model name or a calibrated JSON)")
    policy = make_policy(spec, latency_model=latency_model)
    target = target_for(spec)
    source = source_for_spec(spec, target)
    lp = log_path(settings.decision_log, log_name or spec.name, several)
    log_file = DecisionLog(lp, [t.name for t in spec.triggers]) if lp else None
    loop = make(policy, source, target, log_file) if make is not None else \
        AutoscalerLoop(spec, policy, source, target, state, log_file, telemetry)
    loop.silence.polls = settings.silent_polls
    return loop
