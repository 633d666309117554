"""Everything `slopilot fleet up` starts, in one object: a local fleet of engine processes, a real
Prometheus scraping them, the controller scaling the fleet with the FLEET.yaml's autoscaler, the
optional router in front of the replicas (FLEET.yaml `router:`; its metrics scraped by the same
Prometheus, the load sent through it) and the optional built-in load.

    with LocalRun(load_fleet_config("examples/fleet_local.yaml"), "out/fleet") as run:
        run.wait()          # until the load ends (or stop() from a signal handler)
    run.summary()           # scale events, request counts, latency percentiles

Leaving the block (also on Ctrl-C or an error) stops the load, the controller, the fleet (SIGTERM,
drain) and Prometheus, in that order. The run folder holds the decision log (replayable with
`slopilot replay`), the spec, the policy state, each replica's log and Prometheus's data.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path

from controlplane.assemble import build_loop
from controlplane.batch_load import BatchSubmitter
from controlplane.controller import AutoscalerLoop, Controller
from controlplane.dashboard import Dashboard
from controlplane.fleet import LocalFleet
from controlplane.fleet.config import FleetConfig
from controlplane.fleet.file_sd import write_file_sd
from controlplane.loadgen import LoadGenerator
from controlplane.prometheus_server import PrometheusServer
from controlplane.router.app import build_router_app
from controlplane.router.server import RouterServer
from controlplane.settings import ControllerArgs
from controlplane.sources import PrometheusSource
from controlplane.state import StateStore
from controlplane.telemetry import Telemetry


class LocalRun:
    def __init__(self, config: FleetConfig, out: str | Path, rate_window: float | None = None,
                 with_load: bool = True, settings: ControllerArgs | None = None):
        """settings: the controller's (ControllerArgs; rate_window overrides its window); the state and
        the decision log go in `out` whatever they say."""
        if config.autoscaler is None and config.pd is None:  # a P/D fleet's pools may each have one
            raise ValueError(f"{config.source}: autoscaler: a fleet run needs an autoscaler spec")
        self.cfg, self.out = config, Path(out)
        settings = settings or ControllerArgs()
        log = str(self.out / "decisions.csv").replace("{", "{{").replace("}", "}}")  # a path, not a template
        window = settings.window if rate_window is None else rate_window
        self.settings = dataclasses.replace(settings, window=window, state_dir=str(self.out / "state"),
                                            decision_log=log)
        self.rate_window, self.with_load = self.settings.window, with_load
        self.stopping = threading.Event()
        self.telemetry = Telemetry()
        self.fleet: LocalFleet | None = None
        self.prometheus: PrometheusServer | None = None
        self.loop: AutoscalerLoop | None = None
        self.load: LoadGenerator | None = None
        self.load_result = None
        self.batch: BatchSubmitter | None = None
        self.dashboard: Dashboard | None = None
        self.router: RouterServer | None = None
        self._threads: list[threading.Thread] = []
        self.started = 0.0
        self.ended = 0.0  # when stop() began: the end of the run's GPU-second count
        self.final_frame: str | None = None
        self.metrics_port: int | None = None

    # -- start and stop --------------------------------------------------------------------------
    def start(self) -> LocalRun:
        cfg, out = self.cfg, self.out
        out.mkdir(parents=True, exist_ok=True)
        self._write_spec()
        self.fleet = LocalFleet(cfg, out / "fleet", wait_ready=False)
        self.fleet.start()
        sd_file = self.fleet.file_sd_path
        if cfg.router is not None:  # in front of the ready replicas; Prometheus scrapes it too
            self.router = RouterServer(build_router_app(cfg.router, self.fleet.endpoints, pool_name=cfg.name,
                                                        state_dir=str(out / "router"),  # its Batch API
                                                        batch_engine_priority=cfg.batch_engine_priority))
            self.router.start()
            sd_file = out / "prometheus_targets.json"
            self._merge_targets(sd_file)
            self._thread(self._follow_targets, sd_file)
        self.prometheus = PrometheusServer(scrape_interval=cfg.scrape_interval, data_dir=out / "prometheus",
                                           sd_file=sd_file).start()
        spec = cfg.autoscaler
        model = None
        if spec.needs_latency_model:  # the emulated replicas' own step-time model
            from simulator.latency import load_latency_model

            model = load_latency_model(cfg.emulate) if cfg.emulate else None
            if model is None:
                raise ValueError(f"{cfg.source}: an {spec.policy_type} autoscaler needs an emulated fleet's "
                                 f"model")
        url, window = self.prometheus.url, self.rate_window
        self.loop = build_loop(spec, self.settings, lambda spec: self.fleet,
                               lambda spec, target: PrometheusSource(url, window=window, override=True),
                               model,
                               where=str(cfg.source), state=StateStore(self.settings.state_dir),
                               telemetry=self.telemetry)
        view = PrometheusSource(self.prometheus.url, window=self.rate_window, override=True, aggregates="all")
        self.dashboard = Dashboard([self.loop], [view], title=cfg.name)
        self.started = time.time()
        self.metrics_port = self.telemetry.serve(0, host="127.0.0.1")  # the controller's /metrics, probes
        self._thread(Controller([self.loop], telemetry=self.telemetry).run, self.stopping)
        if self.with_load and cfg.load is not None:
            entry = (lambda: [self.router.url]) if self.router is not None else self.fleet.endpoints
            self.load = LoadGenerator(cfg.load, entry)
            self._thread(self._run_load)
            if cfg.load.batch is not None:  # the fleet's config checked there is a router
                self.batch = BatchSubmitter(cfg.load.batch, self.router.url, time.time())
                self._thread(self.batch.run)
        return self

    def urls(self) -> dict[str, str]:
        """Where each part listens, once started: what `fleet up` prints."""
        out = {"prometheus": self.prometheus.url}
        if self.router is not None:
            out["router"] = self.router.url
        port = self.metrics_port
        out["controller metrics"] = f"http://127.0.0.1:{port}/metrics (/healthz, /readyz)"
        out["replicas"] = ", ".join(self.fleet.endpoints()) or "starting"
        out["dashboard"] = f"this terminal, and {self.out / 'dashboard.txt'} at the end"
        return out

    def _thread(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def fleets(self) -> list[LocalFleet]:
        """Every fleet this run started (a P/D run: its two pools)."""
        return [self.fleet] if self.fleet is not None else []

    def _merge_targets(self, path: Path, last: dict | None = None) -> dict:
        """The fleets' scrape targets plus the router's, written to `path` when they change."""
        targets = {**{a: labels for f in self.fleets() for a, labels in f.targets().items()},
                   self.router.url.split("://", 1)[1]: {"fleet": self.cfg.name, "replica": "router"}}
        if targets != last:
            write_file_sd(path, targets)
        return targets

    def _follow_targets(self, path: Path) -> None:
        last = None
        while not self.stopping.wait(0.5):
            last = self._merge_targets(path, last)

    def _run_load(self) -> None:
        self.load_result = self.load.run()

    def _write_spec(self) -> None:
        cfg = self.cfg
        name = f"{cfg.autoscaler.name}.yaml"
        if cfg.autoscaler_path:
            shutil.copyfile(cfg.autoscaler_path, self.out / name)
        else:
            import yaml

            (self.out / name).write_text(yaml.safe_dump(cfg.autoscaler.doc, sort_keys=False))
        self.spec_path = self.out / name

    def wait(self, duration: float | None = None, on_tick=None) -> None:
        """Until the load has ended (or `duration` seconds, or stop()); on_tick() about every second."""
        end = None if duration is None else time.time() + duration
        while not self.stopping.is_set():
            if on_tick is not None:
                on_tick()
            if end is not None and time.time() >= end:
                break
            if end is None and self.load is not None and self.load_result is not None and (
                    self.batch is None or self.batch.finished.is_set()):  # and the batch has ended
                break
            self.stopping.wait(1.0)

    def stop(self) -> None:
        self.ended = self.ended or time.time()
        if self.dashboard is not None and self.final_frame is None:
            self.dashboard.refresh()
            self.final_frame = self.dashboard.text()  # the last frame while everything still runs
        self.stopping.set()
        if self.load is not None:
            self.load.stop()
        if self.batch is not None:
            self.batch.stop()
        for t in self._threads:
            t.join(timeout=30)
        if self.router is not None:
            self.router.stop()
        for fleet in self.fleets():
            fleet.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.metrics_port is not None:
            self.telemetry.stop()
        for lp in self.loops():
            if lp.log is not None:
                lp.log.close()

    def loops(self) -> list[AutoscalerLoop]:
        return [self.loop] if self.loop is not None else []

    def __enter__(self) -> LocalRun:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------------------------
    def scale_events(self) -> list[dict]:
        """Each change of the applied replica count, from the decision log."""
        return self._events_from(self.out / "decisions.csv")

    def _events_from(self, path: Path) -> list[dict]:
        import csv

        events, last = [], None
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                applied = int(row["desired_replicas"]) if not row["scale_error"] else None
                current = int(row["current_replicas"])
                if last is None:
                    last = current
                if applied is not None and applied != last:
                    events.append({"time_s": round(float(row["time"]) - self.started, 3), "from": last,
                                   "to": applied, "reason": row["reason"]})
                    last = applied
        return events

    def gpu_seconds(self) -> dict:
        """Replica-seconds of every pool from the start to the end of the run (stop() or now), and
        GPU-seconds: replica-seconds x the emulated model's tensor-parallel size (1 for real weights)."""
        end = self.ended or time.time()
        tp = 1
        if self.cfg.emulate:
            from simulator.latency import load_latency_model

            tp = int(getattr(load_latency_model(self.cfg.emulate), "tp", 1) or 1)
        rs = sum(f.replica_seconds(self.started, end) for f in self.fleets())
        return {"run_s": round(end - self.started, 3), "replica_seconds": round(rs, 1),
                "gpus_per_replica": tp, "gpu_seconds": round(rs * tp, 1)}

    def summary(self) -> dict:
        out = {"fleet": self.cfg.name, "autoscaler": self.cfg.autoscaler.name,
               "policy": self.cfg.autoscaler.policy_type, "scale_events": self.scale_events(),
               "decisions_csv": "decisions.csv", "spec": self.spec_path.name}
        if self.load_result is not None:
            out["requests"] = self.load_result.summary()
        if self.batch is not None:
            out["batch"] = self.batch.result()
        out["gpu_seconds"] = self.gpu_seconds()
        return out

    def write_summary(self) -> dict:
        s = self.summary()
        (self.out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
        if self.final_frame is not None:
            (self.out / "dashboard.txt").write_text(self.final_frame)
        if self.load_result is not None:  # one row a request: when it was sent, its latencies
            import csv

            with open(self.out / "requests.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["start_s", "status", "prompt_tokens", "tokens", "ttft_s", "e2e_s"])
                w.writerows([round(r.start, 3), r.status, r.prompt_tokens, r.tokens, r.ttft, r.e2e]
                            for r in sorted(self.load_result.records, key=lambda r: r.start))
        return s
