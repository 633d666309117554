"""The live controller's settings in one place (as engine.args.EngineArgs is the engine's): `slopilot
control`'s flags, the Kubernetes controller (KubeController) and the local fleet (LocalRun) all take a
ControllerArgs. Each default is written here once; the CLI flags take theirs from the dataclass.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

LEASE_NAME = "slopilot-controller"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15.0, 10.0, 2.0  # client-go's leader-election defaults
RESYNC = 300.0  # seconds between full lists of the watched resources
# the simulator's rate window (Scenario.rate_window, the sources' DEFAULT_WINDOW: the same lag live as
# simulated; a test checks they agree), written as a number so that the CLI starts without the simulator
DEFAULT_WINDOW = 60.0


@dataclass
class ControllerArgs:
    # where metrics come from
    prometheus: str | None = None  # every trigger and aggregate (else each trigger's serverAddress)
    scrape: list[str] | None = None  # engine /metrics endpoints scraped directly instead
    engine: str = "auto"  # metric names the engines export
    timeout: float = 5.0  # seconds for each metric query
    window: float = DEFAULT_WINDOW  # seconds of the rates the policies read
    latency_model: str | None = None  # a shipped model's name or a calibrated JSON (sloModel policies)
    # the loops
    workers: int = 5  # reconciles that may run at once
    state_dir: str | None = None  # each policy's state saved here after every decision
    decision_log: str | None = None  # a replayable CSV per autoscaler ({name} in the path)
    # Kubernetes (`control --kube`)
    namespace: str | None = None  # only this namespace's autoscalers (None: every one)
    scaled_objects: bool = False  # also run every KEDA ScaledObject
    leader_election: bool = True
    lease_namespace: str | None = None  # None: the pod's own namespace (KubeController: "default")
    lease_name: str = LEASE_NAME
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD
    identity: str | None = None  # None: host name and a random suffix
    silent_polls: int = 10  # polls in a row a trigger may return no series before it is reported
    scrape_interval: float = 15.0  # seconds between scrapes of a target's pods (no Prometheus)
    resync: float = RESYNC  # seconds between full lists of the watched resources

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("--workers must be >= 1")
        if self.silent_polls < 1:
            raise ValueError(f"--silent-polls: must be >= 1, got {self.silent_polls}")
        if self.window <= 0:
            raise ValueError(f"window: must be > 0 seconds, got {self.window}")

    def load_latency_model(self):
        """The step-time model `latency_model` names (None when it names none)."""
        if not self.latency_model:
            return None
        from simulator.latency import load_latency_model

        return load_latency_model(self.latency_model)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """The controller's flags (those that are settings), defaults from ControllerArgs."""
    d = ControllerArgs()
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL", help="Prometheus server for every trigger and aggregate")
    src.add_argument("--scrape", action="append", metavar="URL",
                     help="scrape these engine /metrics endpoints directly instead of asking Prometheus")
    p.add_argument("--engine", default=d.engine, choices=["auto", "vllm", "sglang", "slopilot"],
                   help="metric names the engines export")
    p.add_argument("--latency-model", metavar="NAME_OR_JSON", help="step-time model for sloModel policies")
    p.add_argument("--state-dir", help="save each policy's state here after every decision, resume from it")
    p.add_argument("--decision-log", metavar="FILE",
                   help="append a replayable CSV row per reconcile ({name} in the path for several specs)")
    p.add_argument("--workers", type=int, default=d.workers, help="reconciles that may run at once")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds for each metric query")
    p.add_argument("--silent-polls", type=int, default=d.silent_polls, metavar="N",
                   help="warn, with the label values that exist, when a trigger's query returns no series "
                        "N polls in a row (KEDA reads it as 0)")


def add_kube_cli_args(k) -> None:
    """The Kubernetes settings' flags, in the --kube argument group."""
    d = ControllerArgs()
    k.add_argument("--namespace", metavar="NS", help="only this namespace's autoscalers (none: every one)")
    k.add_argument("--scaled-objects", action="store_true",
                   help="also run every KEDA ScaledObject (only without KEDA; one ScaledObject opts in with "
                        "the annotation slopilot.dev/managed: \"true\")")
    k.add_argument("--lease-namespace", metavar="NS",
                   help="namespace of the leader-election Lease (none: the pod's own namespace)")
    k.add_argument("--lease-name", default=d.lease_name, help="name of the leader-election Lease")
    k.add_argument("--no-leader-election", action="store_true", help="act without holding the Lease")
    k.add_argument("--lease-duration", type=float, default=d.lease_duration, help=argparse.SUPPRESS)
    k.add_argument("--renew-deadline", type=float, default=d.renew_deadline, help=argparse.SUPPRESS)
    k.add_argument("--retry-period", type=float, default=d.retry_period, help=argparse.SUPPRESS)
    k.add_argument("--scrape-interval", type=float, default=d.scrape_interval,
                   help="seconds between scrapes of the target's pods (when no Prometheus is used)")


def from_cli(args: argparse.Namespace, **overrides) -> ControllerArgs:
    """ControllerArgs from the flags add_cli_args and add_kube_cli_args made."""
    values = {f.name: getattr(args, f.name) for f in fields(ControllerArgs) if hasattr(args, f.name)}
    if hasattr(args, "no_leader_election"):
        values["leader_election"] = not args.no_leader_election
    return ControllerArgs(**{**values, **overrides})
