"""The one YAML loader for input files (specs, scenarios): safe, strict, and with line numbers.

The caller reads the file and passes its text and name; nothing here opens a file. On top of
yaml.SafeLoader it refuses duplicate keys, documents that alias expansion would blow up (a "billion
laughs"), absurd nesting and over-long text, with bounded memory and time; syntax errors name the file
and line. The result is a Document that remembers where each field sits, so a later field error can
name the file and line too:

    doc = parse(text, "examples/x.yaml")
    raise doc.error(("pools", 0, "replicas"), "must be >= 0")
    # ValueError: examples/x.yaml:14: pools[0].replicas: must be >= 0
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_CHARS = 4 * 2**20  # input files are hand-written configuration, not data
MAX_DEPTH = 64  # a scenario's deepest field is about 8 levels down
MAX_NODES = 100_000  # distinct nodes, and nodes after alias expansion (~3 s and ~80 MB of parsing)

MERGE_TAG = "tag:yaml.org,2002:merge"


def dotted(path: tuple) -> str:
    """("pools", 0, "replicas") -> "pools[0].replicas"."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _line(node: Node | None, path: tuple) -> int | None:
    """1-based line of the field at path (of the deepest part of it that exists)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for key in path:
        if isinstance(node, MappingNode):
            match = next(
                ((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == str(key)), None
            )
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


@dataclass(frozen=True, eq=False)
class Document:
    """Parsed data, the file it came from (None: built in code), and where it sits in that file."""

    data: object
    name: str | None = None
    node: Node | None = None  # the composed root of the file, for line numbers
    prefix: tuple = ()  # the path of `data` inside the file

    def at(self, *keys) -> Document:
        """The part of this document at keys, still naming its file and lines."""
        data = self.data
        for k in keys:
            data = data[k]
        return Document(data, self.name, self.node, self.prefix + keys)

    def line(self, path: tuple = ()) -> int | None:
        return _line(self.node, self.prefix + tuple(path))

    def location(self, path: tuple = ()) -> str:
        """'file:line' of the field at path ('file' or '' when that is all there is to say)."""
        line = self.line(path)
        return f"{self.name}:{line}" if self.name and line else (self.name or "")

    def message(self, path: tuple, reason: str) -> str:
        """'file:line: field.path: reason', with what is known of file, line and path."""
        field = dotted(self.prefix + tuple(path))
        return ": ".join(p for p in (self.location(path), field, reason) if p)

    def error(self, path: tuple, reason: str) -> ValueError:
        return ValueError(self.message(path, reason))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


class _Loader(yaml.SafeLoader):
    def __init__(self, text: str):
        super().__init__(text)
        self.depth = 0
        self.count = 0  # distinct nodes composed so far
        self.sizes: dict[int, int] = {}  # id(node) -> its node count with aliases expanded

    def _refuse(self, problem: str, mark) -> None:
        raise yaml.MarkedYAMLError(problem=problem, problem_mark=mark)

    def compose_node(self, parent, index):
        event = self.peek_event()
        alias = isinstance(event, yaml.AliasEvent)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._refuse(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        if not alias:
            self.count += 1
            if self.count > MAX_NODES:
                self._refuse(f"more than {MAX_NODES} values", event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if id(node) not in self.sizes:
            if alias:  # the anchored node is still being composed: it contains itself
                self._refuse(f"alias *{event.anchor} refers to a node that contains it", event.start_mark)
            size = 1 + sum(self.sizes[id(c)] for c in _children(node))
            if size > MAX_NODES:
                self._refuse(
                    f"aliases expand this to more than {MAX_NODES} values (an alias bomb?)", event.start_mark
                )
            self.sizes[id(node)] = size
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue  # merged keys may be overridden; only written keys must be unique
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not None:
                    self._refuse(f"duplicate key {key!r} (first on line {first})", key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error(exc: yaml.YAMLError, name: str | None, text: str = "") -> ValueError:
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow (NUL, BEL, ...)
        line = text.count("\n", 0, exc.position) + 1
        where = f"{name}:{line}" if name else f"line {line}"
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return ValueError(f"{where}: invalid YAML: the character {char!r} (U+{ord(char):04X}) is not allowed "
                          f"in a YAML file")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    reason = f"{context}, {problem}" if context else problem
    line = f"line {mark.line + 1}" if mark is not None else None
    where = f"{name}:{mark.line + 1}" if name and mark is not None else (name or line)
    return ValueError(": ".join(p for p in (where, "invalid YAML", reason) if p))


def parse(text: str, name: str | None = None) -> Document:
    """Parse one YAML document; ValueError naming the file (name) and line when it is not acceptable.
    Field errors from the Document name the line only together with a file name."""
    label = f"{name}: " if name else ""
    if not isinstance(text, str):
        raise ValueError(f"{label}expected YAML text, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ValueError(f"{label}longer than {MAX_CHARS} characters")
    loader = None
    try:
        loader = _Loader(text)  # its reader checks the characters (NUL, BEL, ... are refused here)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, name, text) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer with too many digits
        raise ValueError(f"{label}invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return Document(data, name, node)


def document(data: object, name: str | None = None) -> Document:
    """Already-parsed data (a dict built in code): errors name the fields but no lines."""
    return data if isinstance(data, Document) else Document(data, name)
