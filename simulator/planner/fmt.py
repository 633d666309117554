"""Numbers as the plan and compare reports show them: three significant digits with their unit, a
duration in ms below a second, fractions as percentages, true/false as yes/NO (a miss stands out)."""

from __future__ import annotations


def num(x: float) -> str:
    """Three significant digits, thousands separated: 0.0229, 12.5, 1,234."""
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:,.3g}"


def seconds(x: float | None) -> str:
    """A latency: `299 ms`, `48.2 ms`, `2.35 s`; `-` when there is none."""
    if x is None:
        return "-"
    return f"{num(1000 * x)} ms" if abs(x) < 1 else f"{num(x)} s"


def percent(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def yes_no(x: bool | None) -> str:
    return "-" if x is None else "yes" if x else "NO"


def times(x: float | None) -> str:
    """A ratio to a bound: `1.32x`."""
    return "-" if x is None else f"{x:.2f}x"


def span(x: float) -> str:
    """A length of time: `90 s`, `30 min`, `24 h`."""
    if x < 120:
        return f"{num(x)} s"
    return f"{num(x / 60)} min" if x < 7200 else f"{num(x / 3600)} h"
