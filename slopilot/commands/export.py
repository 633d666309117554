"""`slopilot export keda SPEC.yaml [-o OUT.yaml]`: the equivalent KEDA ScaledObject, where one exists."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "export an InferenceAutoscaler as the equivalent KEDA ScaledObject (where one exists)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=["keda"], help="what to export to")
    parser.add_argument("spec", help="InferenceAutoscaler (or ScaledObject) YAML")
    parser.add_argument("-o", "--output", help="write the ScaledObject here (default: stdout)")
    parser.add_argument(
        "--server-address", default="http://prometheus:9090", help="Prometheus address for generated triggers"
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from autoscaler.export import to_scaled_object
    from autoscaler.spec import load_spec

    path = Path(args.spec)
    spec = load_spec(path.read_text(), path=str(path))  # errors name the file, line and field
    try:
        doc, notes = to_scaled_object(spec, args.server_address)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    header = "".join(f"# note: {n}\n" for n in notes)
    text = header + yaml.safe_dump(doc, sort_keys=False, width=110)
    for n in notes:
        print(f"slopilot export: note: {n}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
