"""The autoscalers to run, from YAML files and folders (multi-document files too).

`ScaledObject` (keda.sh) and `InferenceAutoscaler` (slopilot.dev) become specs; a
`TriggerAuthentication` (keda.sh) supplies bearer/basic credentials to the Prometheus triggers that
reference it, and a `Secret` supplies the values it points at. Any other kind (a Deployment in the
same manifest, say) is skipped with a warning. Errors name the file and line.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.lint import spec_warnings
from autoscaler.spec import Spec, load_spec
from autoscaler.yamlfile import MAX_CHARS, parse
from controlplane.state import name_problem

AUTOSCALER_KINDS = ("ScaledObject", "InferenceAutoscaler")
_SEPARATOR = re.compile(r"^---\s*(#.*)?$")


@dataclass
class Loaded:
    specs: list[tuple[Spec, Path]] = field(default_factory=list)  # each with the file it came from
    trigger_auths: dict[str, dict] = field(default_factory=dict)  # name -> TriggerAuthentication
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> key -> value
    warnings: list[str] = field(default_factory=list)


def documents(text: str, name: str) -> list:
    """Each YAML document of a file; line numbers stay those of the whole file."""
    lines = text.splitlines(keepends=True)
    starts = [0] + [i + 1 for i, line in enumerate(lines) if _SEPARATOR.match(line.rstrip("\n"))]
    ends = [s - 1 for s in starts[1:]] + [len(lines)]
    docs = []
    for start, end in zip(starts, ends):
        chunk = "".join(lines[start:end])
        if not chunk.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in lines[start:end]):
            continue
        doc = parse("\n" * start + chunk, name)  # padded so errors point at the file's own lines
        if doc.data is not None:
            docs.append(doc)
    return docs


def files(paths: list[str | Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file())
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"--spec {p}: no such file or folder")
    return out


def load(paths: list[str | Path]) -> Loaded:
    got = Loaded()
    for path in files(paths):
        for doc in documents(read_text(path), str(path)):
            data = doc.data
            if not isinstance(data, dict):
                raise doc.error((), "a manifest must be a mapping")
            kind, meta = data.get("kind"), data.get("metadata") or {}
            if kind in AUTOSCALER_KINDS:
                problem = name_problem(meta.get("name") if isinstance(meta, dict) else None)
                if problem is not None:  # before anything makes a path of it
                    raise doc.error(("metadata", "name"), problem)
                got.specs.append((load_spec(doc, str(path)), path))
                got.warnings += spec_warnings(doc)  # likely unit and placement mistakes (autoscaler.lint)
            elif kind in ("TriggerAuthentication", "ClusterTriggerAuthentication"):
                got.trigger_auths[meta.get("name", "")] = data
            elif kind == "Secret":
                got.secrets[meta.get("name", "")] = secret_values(data)
            else:
                where = doc.location(("kind",)) or str(path)
                got.warnings.append(f"{where}: skipped a {kind or 'document without a kind'} "
                                    f"(only {', '.join(AUTOSCALER_KINDS)}, TriggerAuthentication and Secret "
                                    f"are read)")
    if not got.specs:
        raise ValueError(f"no ScaledObject or InferenceAutoscaler found in {', '.join(map(str, paths))}")
    return got


def read_text(path: Path) -> str:
    """The file's text, its size checked before it is read (a huge file is refused, not loaded)."""
    size = path.stat().st_size
    if size > MAX_CHARS:
        raise ValueError(f"{path}: {size} bytes, more than the limit of {MAX_CHARS} for an input file")
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read(MAX_CHARS + 1)  # a file growing meanwhile (or a device) is read no further
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    if len(text) > MAX_CHARS:
        raise ValueError(f"{path}: more than the limit of {MAX_CHARS} characters for an input file")
    return text


def secret_values(doc: dict) -> dict[str, str]:
    """A Secret's keys: `stringData` as is, `data` base64-decoded."""
    out = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
    out.update({k: str(v) for k, v in (doc.get("stringData") or {}).items()})
    return out
