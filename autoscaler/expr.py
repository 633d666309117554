"""A small safe expression evaluator for KEDA scalingModifiers formulas (never Python's eval).

Grammar (the expr-lang subset KEDA formulas use):
    expr    := ternary
    ternary := coalesce ('?' expr ':' expr)?
    coalesce:= or ('??' or)*
    or      := and (('||' | 'or') and)*
    and     := cmp (('&&' | 'and') cmp)*
    cmp     := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)?
    sum     := term (('+' | '-') term)*
    term    := unary (('*' | '/' | '%') unary)*
    unary   := ('-' | '!' | 'not') unary | power
    power   := atom ('**' unary)?
    atom    := NUMBER | NAME | NAME '(' args ')' | '(' expr ')' | 'true' | 'false' | 'nil'
Names resolve to trigger values (None = nil); functions: min, max, abs, ceil, floor, round.
"""

from __future__ import annotations

import math
import re

_TOKEN = re.compile(
    r"\s*(?:(\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|([A-Za-z_][A-Za-z0-9_]*)"
    r"|(\?\?|\*\*|&&|\|\||<=|>=|==|!=|[-+*/%<>!?:(),]))"
)
_FUNCS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "floor": math.floor, "round": round}


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"formula {text!r}: unexpected character at column {pos + 1}")
        if m.group(1) is not None:
            tokens.append(("num", m.group(0).strip()))
        elif m.group(2) is not None:
            tokens.append(("name", m.group(2)))
        else:
            tokens.append(("op", m.group(3)))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent straight to a closure tree, so a formula is parsed once and evaluated often."""

    def __init__(self, text: str):
        self.text, self.toks, self.i = text, tokenize(text), 0
        self.names: set[str] = set()

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def accept(self, *ops: str) -> str | None:
        t = self.peek()
        if t and t[1] in ops and (t[0] == "op" or t[1] in ("or", "and", "not")):
            self.i += 1
            return t[1]
        return None

    def expect(self, op: str) -> None:
        if not self.accept(op):
            raise ValueError(f"formula {self.text!r}: expected {op!r}")

    def parse(self):
        node = self.ternary()
        if self.peek() is not None:
            raise ValueError(f"formula {self.text!r}: unexpected {self.peek()[1]!r}")
        return node

    def ternary(self):
        cond = self.coalesce()
        if self.accept("?"):
            a = self.ternary()
            self.expect(":")
            b = self.ternary()
            return lambda env: a(env) if _truthy(cond(env)) else b(env)
        return cond

    def coalesce(self):
        node = self.or_()
        while self.accept("??"):
            left, right = node, self.or_()
            node = (lambda lf, rf: lambda env: v if (v := lf(env)) is not None else rf(env))(left, right)
        return node

    def or_(self):
        node = self.and_()
        while self.accept("||", "or"):
            left, right = node, self.and_()
            node = (lambda lf, rf: lambda env: _truthy(lf(env)) or _truthy(rf(env)))(left, right)
        return node

    def and_(self):
        node = self.cmp()
        while self.accept("&&", "and"):
            left, right = node, self.cmp()
            node = (lambda lf, rf: lambda env: _truthy(lf(env)) and _truthy(rf(env)))(left, right)
        return node

    def cmp(self):
        node = self.sum()
        op = self.accept("<", "<=", ">", ">=", "==", "!=")
        if op:
            left, right = node, self.sum()
            fn = {
                "<": lambda a, b: a < b,
                "<=": lambda a, b: a <= b,
                ">": lambda a, b: a > b,
                ">=": lambda a, b: a >= b,
                "==": lambda a, b: a == b,
                "!=": lambda a, b: a != b,
            }[op]
            return lambda env: fn(_num(left(env)), _num(right(env)))
        return node

    def sum(self):
        node = self.term()
        while op := self.accept("+", "-"):
            left, right = node, self.term()
            node = (
                lambda lf, rf, o: (
                    lambda env: _num(lf(env)) + _num(rf(env)) if o == "+" else _num(lf(env)) - _num(rf(env))
                )
            )(left, right, op)
        return node

    def term(self):
        node = self.unary()
        while op := self.accept("*", "/", "%"):
            left, right = node, self.unary()
            node = (lambda lf, rf, o: lambda env: _arith(o, _num(lf(env)), _num(rf(env))))(left, right, op)
        return node

    def unary(self):
        if self.accept("-"):
            inner = self.unary()
            return lambda env: -_num(inner(env))
        if self.accept("!", "not"):
            inner = self.unary()
            return lambda env: not _truthy(inner(env))
        return self.power()

    def power(self):
        base = self.atom()
        if self.accept("**"):
            exp = self.unary()
            return lambda env: _num(base(env)) ** _num(exp(env))
        return base

    def atom(self):
        t = self.peek()
        if t is None:
            raise ValueError(f"formula {self.text!r}: unexpected end")
        self.i += 1
        kind, val = t
        if kind == "num":
            v = float(val)
            return lambda env: v
        if kind == "name":
            if val in ("true", "false"):
                b = val == "true"
                return lambda env: b
            if val == "nil":
                return lambda env: None
            if self.accept("("):
                if val not in _FUNCS:
                    raise ValueError(f"formula {self.text!r}: unknown function {val!r}")
                args = [] if self.accept(")") else self._args()
                fn = _FUNCS[val]
                return lambda env: float(fn(*[_num(a(env)) for a in args]))
            self.names.add(val)
            return lambda env: env[val] if val in env else _unknown(val)
        if val == "(":
            node = self.ternary()
            self.expect(")")
            return node
        raise ValueError(f"formula {self.text!r}: unexpected {val!r}")

    def _args(self):
        args = [self.ternary()]
        while self.accept(","):
            args.append(self.ternary())
        self.expect(")")
        return args


def _unknown(name: str):
    raise ValueError(f"formula uses unknown name {name!r}")


def _truthy(v) -> bool:
    return bool(v) if v is not None else False


def _num(v) -> float:
    if v is None:
        raise ValueError("formula used a nil value in arithmetic (use ?? to give a default)")
    return float(v)


def _arith(op: str, a: float, b: float) -> float:
    if op == "*":
        return a * b
    if b == 0:
        return math.inf if op == "/" and a > 0 else (-math.inf if op == "/" and a < 0 else math.nan)
    return a / b if op == "/" else math.fmod(a, b)


class Formula:
    def __init__(self, text: str):
        parser = _Parser(text)
        self.text = text
        self._fn = parser.parse()
        self.names = frozenset(parser.names)

    def __call__(self, env: dict[str, float | None]) -> float:
        v = self._fn(env)
        if isinstance(v, bool):
            return 1.0 if v else 0.0
        return _num(v)


def evaluate(text: str, env: dict[str, float | None]) -> float:
    return Formula(text)(env)
