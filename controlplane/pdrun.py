"""`fleet up` of a P/D fleet (FLEET.yaml with `pd:`, controlplane.fleet.pd): a prefill pool and a decode
pool of engine processes with KV transfer between them, the router in P/D mode in front (the decode
pool its endpoints, the prefill pool its prefill endpoints, both followed as they scale), one
Prometheus scraping both pools and the router, each pool's optional autoscaler, the load through the
router, and a dashboard row per pool.

    with PDLocalRun(load_fleet_config("examples/fleet_pd.yaml"), "out/pd") as run:
        run.pools["prefill"], run.pools["decode"]     # the two LocalFleets (scale targets)
        run.wait()

Run folder: `<name>-prefill/` and `<name>-decode/` (each pool's replicas' logs, events), one decision
log and state folder per autoscaled pool (`decisions-<pool name>.csv`, `state/<pool name>/`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

from controlplane.assemble import build_loop
from controlplane.batch_load import BatchSubmitter
from controlplane.controller import AutoscalerLoop, Controller
from controlplane.dashboard import Dashboard
from controlplane.fleet import LocalFleet
from controlplane.loadgen import LoadGenerator
from controlplane.localrun import LocalRun
from controlplane.prometheus_server import PrometheusServer
from controlplane.router.app import build_router_app
from controlplane.router.pd import PDSettings
from controlplane.router.server import RouterServer
from controlplane.sources import PrometheusSource
from controlplane.state import StateStore


class PDLocalRun(LocalRun):
    pools: dict[str, LocalFleet]
    pool_loops: dict[str, AutoscalerLoop]

    def fleets(self) -> list[LocalFleet]:
        return list(getattr(self, "pools", {}).values())

    def loops(self) -> list[AutoscalerLoop]:
        return list(getattr(self, "pool_loops", {}).values())

    def start(self) -> PDLocalRun:
        cfg, out, pd = self.cfg, self.out, self.cfg.pd
        out.mkdir(parents=True, exist_ok=True)
        self.pools, self.pool_loops = {}, {}
        for role, pool in pd.pools().items():  # each waits for its first replicas
            self.pools[role] = LocalFleet(pool, out / pool.name, wait_ready=False)
            self.pools[role].start()
        self.fleet = self.pools["decode"]
        prefill, decode = self.pools["prefill"], self.pools["decode"]
        self.router = RouterServer(build_router_app(cfg.router, decode.endpoints, pool_name=cfg.name,
                                                    state_dir=str(out / "router"),
                                                    pd=PDSettings(prefill.endpoints, pd.threshold),
                                                    batch_engine_priority=cfg.batch_engine_priority))
        self.router.start()
        sd_file = out / "prometheus_targets.json"
        self._merge_targets(sd_file)
        self._thread(self._follow_targets, sd_file)
        self.prometheus = PrometheusServer(scrape_interval=cfg.scrape_interval, data_dir=out / "prometheus",
                                           sd_file=sd_file).start()
        rows, sources = [], []
        for role, pool in pd.pools().items():
            selector = f'fleet="{pool.name}"'  # this pool's replicas only
            sources.append(PrometheusSource(self.prometheus.url, window=self.rate_window, override=True,
                                            aggregates="all", selector=selector))
            if pool.autoscaler is None:
                rows.append(SimpleNamespace(name=pool.name, target=self.pools[role], spec=None,
                                            last_step=None))
                continue
            lp = self._loop(role, pool, selector)
            self.pool_loops[role] = lp
            rows.append(lp)
        self.loop = next(iter(self.pool_loops.values()), None)
        self.dashboard = Dashboard(rows, sources, title=cfg.name, pools=[p.name for p in pd.pools().values()])
        self.started = time.time()
        self.metrics_port = self.telemetry.serve(0, host="127.0.0.1")
        if self.pool_loops:
            self._thread(Controller(self.loops(), telemetry=self.telemetry).run, self.stopping)
        if self.with_load and cfg.load is not None:
            self.load = LoadGenerator(cfg.load, lambda: [self.router.url])
            self._thread(self._run_load)
            if cfg.load.batch is not None:
                self.batch = BatchSubmitter(cfg.load.batch, self.router.url, time.time())
                self._thread(self.batch.run)
        return self

    def _loop(self, role: str, pool, selector: str) -> AutoscalerLoop:
        spec, out = pool.autoscaler, self.out
        log = str(out / f"decisions-{pool.name}.csv").replace("{", "{{").replace("}", "}}")
        settings = dataclasses.replace(self.settings, state_dir=str(out / "state" / pool.name),
                                       decision_log=log)
        model = None
        if spec.needs_latency_model:
            from simulator.latency import load_latency_model

            model = load_latency_model(pool.emulate) if pool.emulate else None
        url, window = self.prometheus.url, self.rate_window
        return build_loop(spec, settings, lambda spec: self.pools[role],
                          lambda spec, target: PrometheusSource(url, window=window, override=True,
                                                                selector=selector),
                          model, where=str(pool.source), state=StateStore(settings.state_dir),
                          telemetry=self.telemetry, log_name=pool.name)

    def urls(self) -> dict[str, str]:
        out = super().urls()
        del out["replicas"]
        for role, fleet in self.pools.items():
            out[f"{role} replicas"] = ", ".join(fleet.endpoints()) or "starting"
        return out

    def _write_spec(self) -> None:  # each pool's spec is written by its loop's decision log
        pass

    def scale_events(self) -> list[dict]:
        events = []
        for role, fleet in self.pools.items():
            path = self.out / f"decisions-{fleet.name}.csv"
            if path.is_file():
                events += [{"pool": role, **e} for e in self._events_from(path)]
        return sorted(events, key=lambda e: e["time_s"])

    def summary(self) -> dict:
        pd = self.cfg.pd
        out = {"fleet": self.cfg.name, "pd_threshold": pd.threshold, "scale_events": self.scale_events(),
               "pools": {role: {"name": p.name, "replicas": p.replicas,
                                "autoscaler": p.autoscaler.name if p.autoscaler else None,
                                "decisions_csv": f"decisions-{p.name}.csv" if p.autoscaler else None}
                         for role, p in pd.pools().items()}}
        if self.load_result is not None:
            out["requests"] = self.load_result.summary()
        if self.batch is not None:
            out["batch"] = self.batch.result()
        out["gpu_seconds"] = self.gpu_seconds()  # both pools
        return out


def make_run(cfg, out: str | Path, **kwargs) -> LocalRun:
    """The run for this fleet: a PDLocalRun for a P/D fleet, else a LocalRun."""
    return (PDLocalRun if cfg.pd is not None else LocalRun)(cfg, out, **kwargs)
