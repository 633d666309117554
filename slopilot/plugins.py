"""Plugins: a user's own modules that register a policy type (autoscaler.registry.register), a scorer or
a picker (routing.scorers.register_scorer, routing.pickers.register_picker) when they are imported.

    slopilot --plugin my_policy --plugin my_org.routing simulate scenario.yaml
    SLOPILOT_PLUGINS=my_policy,my_org.routing slopilot route -c router.yaml

Each is a module name (not a file path), imported before the subcommand runs: SLOPILOT_PLUGINS' first,
then the --plugin ones in order, with the current folder on the import path (as `python -m` has it),
so `--plugin my_policy` finds ./my_policy.py. One that fails to import stops the command with its name
and the reason. The whole list is left in SLOPILOT_PLUGINS, and the current folder on the import path,
for the processes the command starts (the planner's local worker processes import them too:
simulator.planner.sweep; a Ray cluster's workers do not).
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "SLOPILOT_PLUGINS"
FLAG = "--plugin"
HELP = ("import MODULE before the command runs: a module registering its own policy type, scorer or "
        f"picker (repeatable; also {ENV}=mod1,mod2)")


class PluginError(ValueError):
    pass


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """The --plugin modules given before the subcommand, and the arguments left."""
    names: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == FLAG:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise PluginError(f"{FLAG} needs a module name")
            names.append(argv[i + 1])
            i += 2
        elif arg.startswith(FLAG + "="):
            names.append(arg[len(FLAG) + 1:])
            i += 1
        else:
            break
    return names, argv[i:]


def from_env(environ: dict | None = None) -> list[str]:
    value = (os.environ if environ is None else environ).get(ENV, "")
    return [n.strip() for n in value.split(",") if n.strip()]


def load(flag_names: list[str]) -> list[str]:
    """Imports SLOPILOT_PLUGINS' modules, then `flag_names`; returns them all. PluginError names the
    module that failed (and where it was given) and why."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    given = [(n, ENV) for n in from_env()] + [(n, FLAG) for n in flag_names]
    done: list[str] = []
    for name, where in given:
        if name not in done:
            _import(name, where)
            done.append(name)
    if done:
        os.environ[ENV] = ",".join(done)  # the processes this command starts load them too
    return done


def _import(name: str, where: str) -> None:
    if name.endswith(".py") or "/" in name or "\\" in name:
        raise PluginError(f"plugin {name!r} ({where}): give a module name such as "
                          f"{os.path.basename(name).removesuffix('.py')!r}, its folder on the import path "
                          "(the current folder or PYTHONPATH), not a file path")
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise PluginError(f"plugin {name!r} ({where}): no module named {exc.name!r} on the import path "
                              "(the current folder, PYTHONPATH, installed packages)") from None
        raise PluginError(f"plugin {name!r} ({where}) failed to import: {exc}") from None
    except Exception as exc:  # whatever the user's module raised, said with its name
        why = f"{type(exc).__name__}: {exc}"
        raise PluginError(f"plugin {name!r} ({where}) failed to import: {why}") from None
