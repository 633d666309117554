"""A rich progress bar over a sweep's simulations (on stderr); the total grows as searches ask for
more runs. Used as `with SweepProgress(show) as p: drive(tasks, runner, p)`. Off a terminal
(show="lines"), a line every 30 s instead: the stage, simulations done of those asked so far, the ETA."""

from __future__ import annotations

import sys
import time


class SweepProgress:
    def __init__(self, show: bool | str, label: str = "simulations", every: float = 30.0,
                 clock=time.monotonic):
        self.show, self.label = show, label
        self.bar = self.task = None
        self.lines = show == "lines"
        self.every, self.clock = every, clock
        self.start = self.last = clock()
        self.done = self.total = 0
        self.stage_label = label

    def __enter__(self) -> SweepProgress:
        if self.show and not self.lines:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=0)
        return self

    def stage(self, label: str) -> None:
        self.stage_label = label
        if self.bar is not None:
            self.bar.update(self.task, description=label)

    def add(self, n: int) -> None:
        self.total += n
        if self.bar is not None:
            self.bar.update(self.task, total=self.bar.tasks[0].total + n)

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        now = self.clock()
        if self.lines and now - self.last >= self.every:
            self.last = now
            elapsed = now - self.start
            left = elapsed / self.done * (self.total - self.done)
            print(f"{self.stage_label}: {self.done} of {self.total} simulations asked so far, "
                  f"{elapsed:.0f} s elapsed, ETA {left:.0f} s for those", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
