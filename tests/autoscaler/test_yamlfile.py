"""The one YAML loader (autoscaler.yamlfile): duplicate keys and syntax errors with file and line, alias
bombs, recursive aliases, nesting and size bounds, and the line of a field."""

import time
import tracemalloc

import pytest

from autoscaler import yamlfile
from autoscaler.yamlfile import parse

# ---- the YAML loader -------------------------------------------------------------------------------


def test_duplicate_keys_are_errors_naming_file_and_line():
    text = "a: 1\nb:\n  c: 2\n  c: 3\n"
    with pytest.raises(ValueError, match=r"^x\.yaml:4: invalid YAML: duplicate key 'c' \(first on line 3\)"):
        parse(text, "x.yaml")
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        parse("a: 1\na: 1\n", "x.yaml")
    # a merge key's values may be overridden: only keys written twice are duplicates
    assert parse("base: &b {k: 1, j: 2}\nuse:\n  <<: *b\n  k: 3\n").data["use"] == {"k": 3, "j": 2}


def test_syntax_errors_name_file_and_line():
    with pytest.raises(ValueError, match=r"^s\.yaml:3: invalid YAML: .*expected ',' or ']'"):
        parse("a: 1\nb: [1, 2\nc: 3\n", "s.yaml")
    with pytest.raises(ValueError, match=r"^s\.yaml:2: invalid YAML: expected a single document"):
        parse("a: 1\n---\nb: 2\n", "s.yaml")
    with pytest.raises(ValueError, match=r"^line 1: invalid YAML"):  # text without a file name
        parse("a: [")


def test_alias_bomb_is_refused_fast_and_in_bounded_memory():
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):  # 9**10 values once expanded
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^bomb\.yaml:\d+: invalid YAML: aliases expand this to more than"):
        parse("\n".join(lines), "bomb.yaml")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 10.0 and peak < 20 * 2**20  # expanded, it would take hours and gigabytes
    # aliases within the budget are fine, and expand to shared values
    doc = parse("a: &a [1, 2]\nb: [*a, *a]\n")
    assert doc.data["b"] == [[1, 2], [1, 2]]


def test_recursive_alias_deep_nesting_and_size_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="alias \\*a refers to a node that contains it"):
        parse("a: &a [1, *a]\n", "r.yaml")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^d\.yaml:1: invalid YAML: nested deeper than 64 levels"):
        parse("a: " + "[" * 100_000 + "]" * 100_000, "d.yaml")
    assert time.perf_counter() - t0 < 10.0  # refused while reading, not after parsing it all
    assert parse("a: " + "[" * 60 + "]" * 60).data["a"] is not None
    with pytest.raises(ValueError, match="longer than"):
        parse("a: 1\n" + "#" * (yamlfile.MAX_CHARS + 1), "big.yaml")
    monkeypatch.setattr(yamlfile, "MAX_NODES", 1000)
    with pytest.raises(ValueError, match="more than 1000 values"):
        parse("[" + ", ".join(["1"] * 1500) + "]", "flat.yaml")


def test_document_names_the_line_of_a_field():
    text = "a: 1\nlist:\n  - x: 1\n  - x: 2\n    y: {z: 3}\n"
    doc = parse(text, "f.yaml")
    assert doc.line(("list", 1, "y", "z")) == 5
    assert doc.at("list", 1).message(("x",), "bad") == "f.yaml:4: list[1].x: bad"
    assert doc.message(("list", 7), "bad") == "f.yaml:2: list[7]: bad"  # the deepest part that exists
