"""What a KEDA formula's values go through at evaluation (autoscaler.expr compiles formulas to
closures over these): name lookups, truthiness, checked arithmetic that fails instead of answering
inf/NaN/complex, comparisons and the functions. Each failure is a Failed naming the operation."""

from __future__ import annotations

import math

# name -> (function, fewest arguments, most arguments or None)
FUNCS = {
    "min": (min, 1, None),
    "max": (max, 1, None),
    "abs": (abs, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "floor": (math.floor, 1, 1),
    "round": (round, 1, 1),
}
CMP = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class Failed(Exception):
    """Why an evaluation failed; Formula turns it into a FormulaError naming the formula."""


def lookup(env: dict, name: str):
    if name not in env:
        raise Failed(f"unknown name {name!r}")
    v = env[name]
    if v is not None and not isinstance(v, bool) and not math.isfinite(v):
        raise Failed(f"{name} is {v}, not a finite number")
    return v


def truthy(v) -> bool:
    return bool(v) if v is not None else False


def num(v) -> float:
    if v is None:
        raise Failed("a nil value in arithmetic (use ?? to give a default)")
    v = float(v)
    if not math.isfinite(v):
        raise Failed(f"{v} is not a finite number")
    return v


def arith(op: str, a: float, b: float) -> float:
    """a op b, or Failed for what has no finite real answer."""
    shown = f"{_g(a)} {op} {_g(b)}"
    if b == 0 and op in ("/", "%"):
        raise Failed(f"division by zero ({shown})")
    try:
        if op == "+":
            v = a + b
        elif op == "-":
            v = a - b
        elif op == "*":
            v = a * b
        elif op == "/":
            v = a / b
        elif op == "%":
            v = math.fmod(a, b)
        else:
            v = a**b
    except ZeroDivisionError:
        raise Failed(f"division by zero ({shown})") from None
    except OverflowError:
        raise Failed(f"overflow ({shown})") from None
    if isinstance(v, complex):
        raise Failed(f"{shown} has no real value")
    if not math.isfinite(v):
        raise Failed(f"overflow ({shown})")
    return v


def _g(x: float) -> str:
    return f"({x:g})" if x < 0 else f"{x:g}"
