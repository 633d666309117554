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

Every failure is a FormulaError (a ValueError): a formula that does not parse, and at evaluation an
overflow, a division by zero, a complex power, a nil in arithmetic or a result that is not a finite
number; nothing is ever read as 0. The cost is bounded: at most MAX_CHARS of text, nested at most
MAX_NESTING deep (parentheses, arguments, ternaries, prefix operators, powers), every value a float, so one
evaluation is a walk over at most a few hundred nodes.
"""

from __future__ import annotations

import math
import re

from autoscaler.expr_ops import CMP, FUNCS, Failed, arith, lookup, num, truthy

MAX_CHARS = 1000  # a KEDA formula is one line over a few trigger names
MAX_NESTING = 32  # keeps parsing and evaluation far from Python's recursion limit

_TOKEN = re.compile(
    r"\s*(?:(\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|([A-Za-z_][A-Za-z0-9_]*)"
    r"|(\?\?|\*\*|&&|\|\||<=|>=|==|!=|[-+*/%<>!?:(),]))"
)


class FormulaError(ValueError):
    """A formula that does not parse, or whose evaluation failed (KEDA: a failed scaler metric)."""


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FormulaError(f"formula {_short(text)}: unexpected character at column {pos + 1}")
        if m.group(1) is not None:
            tokens.append(("num", m.group(0).strip()))
        elif m.group(2) is not None:
            tokens.append(("name", m.group(2)))
        else:
            tokens.append(("op", m.group(3)))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent straight to a closure tree, so a formula is parsed once and evaluated often.
    Chains of one operator (a + b - c, a ?? b ?? c) are one node evaluated in a loop, so only nesting
    makes the tree deep, and nesting is bounded."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise FormulaError(f"formula must be text, got {type(text).__name__}")
        if len(text) > MAX_CHARS:
            raise FormulaError(f"formula is {len(text)} characters long, more than the limit of {MAX_CHARS}")
        self.text, self.toks, self.i, self.depth = text, tokenize(text), 0, 0
        self.names: set[str] = set()

    def fail(self, what: str) -> FormulaError:
        return FormulaError(f"formula {_short(self.text)}: {what}")

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
            raise self.fail(f"expected {op!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"nested more than {MAX_NESTING} levels deep")

    def parse(self):
        node = self.ternary()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()[1]!r}")
        return node

    def ternary(self):
        self.enter()
        cond = self.coalesce()
        if self.accept("?"):
            a = self.ternary()
            self.expect(":")
            b = self.ternary()
            self.depth -= 1
            return lambda env: a(env) if truthy(cond(env)) else b(env)
        self.depth -= 1
        return cond

    def coalesce(self):
        parts = [self.or_()]
        while self.accept("??"):
            parts.append(self.or_())
        if len(parts) == 1:
            return parts[0]

        def run(env):
            for part in parts:
                v = part(env)
                if v is not None:
                    return v
            return None

        return run

    def or_(self):
        parts = [self.and_()]
        while self.accept("||", "or"):
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else (lambda env: any(truthy(p(env)) for p in parts))

    def and_(self):
        parts = [self.cmp()]
        while self.accept("&&", "and"):
            parts.append(self.cmp())
        return parts[0] if len(parts) == 1 else (lambda env: all(truthy(p(env)) for p in parts))

    def cmp(self):
        node = self.sum()
        op = self.accept(*CMP)
        if op:
            left, right, fn = node, self.sum(), CMP[op]
            return lambda env: fn(num(left(env)), num(right(env)))
        return node

    def _chain(self, operand, ops: tuple[str, ...]):
        first, rest = operand(), []
        while op := self.accept(*ops):
            rest.append((op, operand()))
        if not rest:
            return first

        def run(env):
            v = num(first(env))
            for o, f in rest:
                v = arith(o, v, num(f(env)))
            return v

        return run

    def sum(self):
        return self._chain(self.term, ("+", "-"))

    def term(self):
        return self._chain(self.unary, ("*", "/", "%"))

    def unary(self):
        if op := self.accept("-", "!", "not"):
            self.enter()
            inner = self.unary()
            self.depth -= 1
            if op == "-":
                return lambda env: -num(inner(env))
            return lambda env: not truthy(inner(env))
        return self.power()

    def power(self):
        base = self.atom()
        if self.accept("**"):  # right-associative: a ** b ** c nests
            self.enter()
            exp = self.unary()
            self.depth -= 1
            return lambda env: arith("**", num(base(env)), num(exp(env)))
        return base

    def atom(self):
        t = self.peek()
        if t is None:
            raise self.fail("unexpected end")
        self.i += 1
        kind, val = t
        if kind == "num":
            v = float(val)
            if not math.isfinite(v):
                raise self.fail(f"number {val} is too large")
            return lambda env: v
        if kind == "name":
            if val in ("true", "false"):
                b = val == "true"
                return lambda env: b
            if val == "nil":
                return lambda env: None
            if self.accept("("):
                return self.call(val)
            self.names.add(val)
            return lambda env: lookup(env, val)
        if val == "(":
            node = self.ternary()
            self.expect(")")
            return node
        raise self.fail(f"unexpected {val!r}")

    def call(self, name: str):
        if name not in FUNCS:
            raise self.fail(f"unknown function {name!r} (functions: {', '.join(FUNCS)})")
        fn, least, most = FUNCS[name]
        args = [] if self.accept(")") else self._args()
        if len(args) < least or (most is not None and len(args) > most):
            wanted = f"{least}" if most == least else f"at least {least}"
            raise self.fail(f"{name}() takes {wanted} argument(s), got {len(args)}")
        if most == 1:
            arg = args[0]
            return lambda env: float(fn(num(arg(env))))
        return lambda env: float(fn([num(a(env)) for a in args]))

    def _args(self):
        args = [self.ternary()]
        while self.accept(","):
            args.append(self.ternary())
        self.expect(")")
        return args


class Formula:
    def __init__(self, text: str):
        parser = _Parser(text)
        self.text = text
        try:
            self._fn = parser.parse()
        except RecursionError:  # a caller already deep in its own stack
            raise FormulaError(f"formula {_short(text)}: nested too deeply") from None
        self.names = frozenset(parser.names)

    def __call__(self, env: dict[str, float | None]) -> float:
        """The formula's value: a finite float, else FormulaError."""
        try:
            v = self._fn(env)
            if isinstance(v, bool):
                return 1.0 if v else 0.0
            if v is None:
                raise Failed("the result is nil")
            return num(v)
        except (Failed, ArithmeticError, RecursionError, TypeError, ValueError) as exc:
            raise FormulaError(f"formula {_short(self.text)}: {exc}") from None


def evaluate(text: str, env: dict[str, float | None]) -> float:
    return Formula(text)(env)
