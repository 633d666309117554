"""The one `slopilot` command. Each subcommand is one module in slopilot/commands, imported
lazily, so `slopilot --help` starts fast and never imports torch.

Each subcommand module exposes HELP (one line), add_arguments(parser) and run(args) -> int.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys

from slopilot import plugins

DESCRIPTION = "slopilot: autoscaling control plane and SLO simulator for LLM inference fleets"

# name -> module implementing it; a module that is not present is simply not listed.
SUBCOMMANDS: dict[str, str] = {
    "demo": "slopilot.commands.demo",
    "generate": "slopilot.commands.generate",
    "profile": "slopilot.commands.profile",
    "serve": "slopilot.commands.serve",
    "calibrate": "slopilot.commands.calibrate",
    "predict": "slopilot.commands.predict",
    "convert": "slopilot.commands.convert",
    "simulate": "slopilot.commands.simulate",
    "replay": "slopilot.commands.replay",
    "query": "slopilot.commands.query",
    "record": "slopilot.commands.record",
    "export": "slopilot.commands.export",
    "control": "slopilot.commands.control",
    "fleet": "slopilot.commands.fleet",
    "route": "slopilot.commands.route",
    "async": "slopilot.commands.async_consumer",  # (`async` is a Python keyword)
    "plan": "slopilot.commands.plan",
    "compare": "slopilot.commands.compare",
    "models": "slopilot.commands.models",
    "lint": "slopilot.commands.lint",
}


def _available() -> dict[str, str]:
    found = {}
    for name, module in SUBCOMMANDS.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found[name] = module
        except ModuleNotFoundError:
            pass
    return found


class _Version(argparse.Action):
    """--version, read from the package metadata only when asked (importlib.metadata is slow to load)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from engine.server.defaults import version

        print(f"slopilot {version()}")
        parser.exit()


def build_parser(modules: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slopilot", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version)
    parser.add_argument(plugins.FLAG, action="append", metavar="MODULE", dest="plugins", help=plugins.HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in modules.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # the user's own policy types, scorers and pickers, registered before anything reads them
        names, argv = plugins.split_argv(argv)
        loaded = plugins.load(names)
    except plugins.PluginError as exc:
        print(f"slopilot: error: {exc}", file=sys.stderr)
        return 2
    modules = _available()
    # only import the chosen subcommand's module (others may import heavy libraries)
    if argv and argv[0] in modules:
        modules = {argv[0]: modules[argv[0]]}
        prepare = getattr(importlib.import_module(modules[argv[0]]), "prepare_argv", None)
        if prepare is not None:  # a command whose positional words may start with '-'
            argv = [argv[0], *prepare(argv[1:])]
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    late = [n for n in args.plugins or [] if n not in loaded]  # given after another global option
    if late:
        try:
            plugins.load(late)
        except plugins.PluginError as exc:
            print(f"slopilot: error: {exc}", file=sys.stderr)
            return 2
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        rc = int(args._run(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below rather than at exit
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except (ValueError, FileNotFoundError) as exc:
        print(f"slopilot {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _closed_pipe() -> int:
    """The reader of our output went away (`slopilot predict ... | head`): stop quietly, with the
    status of a command ended by SIGPIPE, and let nothing more be written to the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
