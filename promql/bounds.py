"""Bounds on a PromQL query's text, checked before any parser sees it.

promql-parser's cost grows faster than the text: a 3,000-term sum takes 6.5 s and 1.4 GB to parse,
3,000 nested parentheses 634 MB, and tens of thousands of either overflow its stack. Queries that
autoscalers and dashboards use are a few hundred characters with a handful of operators, so these
limits sit far above them and far below the parser's trouble (a 500-term sum: 0.05 s, 40 MB).
"""

from __future__ import annotations

import re

MAX_QUERY_CHARS = 8192
MAX_NESTING = 64  # ( [ { together
MAX_OPERATORS = 500  # binary and unary operators outside label matchers (and, or, unless included)
_WORD_OPS = re.compile(r"\b(and|or|unless)\b")
_OP_CHARS = frozenset("+-*/%^<>=!")


def query_problem(text: str) -> str | None:
    """Why `text` is refused before parsing (None: it may be parsed)."""
    if len(text) > MAX_QUERY_CHARS:
        return f"the query is {len(text)} characters long, more than the limit of {MAX_QUERY_CHARS}"
    depth = deepest = ops = braces = 0
    quote, escaped, plain = "", False, []
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'`":
            quote = ch
            plain.append(" ")
            continue
        plain.append(ch)
        if ch in "([{":
            depth += 1
            braces += ch == "{"
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
            braces -= ch == "}"
        elif ch in _OP_CHARS and braces <= 0:
            ops += 1
    if deepest > MAX_NESTING:
        return f"the query nests brackets {deepest} deep, more than the limit of {MAX_NESTING}"
    ops += len(_WORD_OPS.findall("".join(plain)))
    if ops > MAX_OPERATORS:
        return f"the query has {ops} operators, more than the limit of {MAX_OPERATORS}"
    return None
