"""The live terminal dashboard: per autoscaler, replicas, load, latency against the SLO, last decision.

It reads fleet-wide aggregates through its own metric source (so what it shows never changes what
the policy sees) and the loop's last step.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text


def _f(v, fmt: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _slo_cell(value: float | None, slo) -> Text:
    if value is None:
        return Text("-")
    text = f"{value:.3f}s" + (f" / {slo.seconds:g}s" if slo else "")
    return Text(text, style=("red" if slo and value > slo.seconds else "green") if slo else "")


class Dashboard:
    def __init__(self, loops, sources, title: str = "slopilot", pools: list[str] | None = None):
        """loops: each row's autoscaler loop (or a stand-in with name, target, spec None and last_step
        None for a pool without one); pools: each row's pool name, shown first (a P/D fleet's two)."""
        self.loops, self.sources, self.title, self.pools = loops, sources, title, pools
        self.started = time.time()
        self.views: dict[str, object] = {}

    def refresh(self) -> None:
        """Reads every autoscaler's aggregates now (a few Prometheus queries each)."""
        for lp, source in zip(self.loops, self.sources):
            current, ready = lp.target.replicas()
            try:
                self.views[lp.name] = source.observe(None, time.time(), current, ready)
            except Exception:  # the dashboard never stops the run
                self.views[lp.name] = None

    def render(self) -> Group:
        table = Table(title=f"{self.title}  t={time.time() - self.started:.0f}s", expand=True)
        first_cols = ("pool",) if self.pools else ()
        for col in first_cols + ("autoscaler", "desired", "ready", "starting", "req/s", "waiting", "KV",
                                 "TTFT p90", "TPOT p90", "last decision"):
            table.add_column(col, overflow="fold")
        for i, lp in enumerate(self.loops):
            step, obs = lp.last_step, self.views.get(lp.name)
            current, ready = lp.target.replicas()
            starting = lp.target.starting() if hasattr(lp.target, "starting") else 0
            slos = {s.metric: s for s in getattr(lp.spec, "slos", [])}
            ttft = obs.ttft_p.get(90.0) if obs else None
            tpot = obs.tpot_p.get(90.0) if obs else None
            reason = "-" if step is None else step.decision.reason + (f" [scale failed: {step.error}]"
                                                                       if step.error else "")
            first = (self.pools[i],) if self.pools else ()
            name = lp.name if lp.spec is not None else "-"  # a pool without an autoscaler
            table.add_row(*first, name, str(current), str(ready), str(starting),
                          _f(obs.arrival_rate if obs else None), _f(obs.num_waiting if obs else None, ".0f"),
                          _f(100 * obs.kv_usage if obs and obs.kv_usage is not None else None, ".0f") + "%",
                          _slo_cell(ttft, slos.get("ttft")), _slo_cell(tpot, slos.get("tpot")), reason)
        return Group(table)

    def text(self, width: int = 160) -> str:
        """The current frame as plain text (for the demo's output folder)."""
        from rich.console import Console

        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(self.render())
        return console.export_text()
