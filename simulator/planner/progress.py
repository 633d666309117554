"""A rich progress bar over a sweep's simulations (on stderr); the total grows as searches ask for
more runs. Used as `with SweepProgress(show) as p: drive(tasks, runner, p)`."""

from __future__ import annotations


class SweepProgress:
    def __init__(self, show: bool, label: str = "simulations"):
        self.show, self.label = show, label
        self.bar = self.task = None

    def __enter__(self) -> SweepProgress:
        if self.show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=0)
        return self

    def stage(self, label: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=label)

    def add(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, total=self.bar.tasks[0].total + n)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
