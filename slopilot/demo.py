"""`slopilot demo`: the main job in one command (for now: the engine generating with `tiny`)."""

from __future__ import annotations

import argparse

HELP = "run the demo: batch generation with the tiny model, printing throughput"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.cli_generate import add_arguments as generate_arguments

    generate_arguments(p)


def run(args: argparse.Namespace) -> int:
    from engine.cli_generate import run as generate

    return generate(args)
