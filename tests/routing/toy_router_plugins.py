"""A toy scorer and a toy picker, declared in this one module and nowhere else. Importing it registers
them; tests/routing/test_router_registry.py shows the simulated router, the scenario schema, the router's
EndpointPickerConfig and `slopilot route` all take them; tests/slopilot/test_plugins.py loads it into
separate `slopilot` processes (`--plugin tests.routing.toy_router_plugins`).

* `fullest` (plugin type `fullest-cache-scorer`): the KV-cache usage itself, so the fullest replica
  wins (bin packing; the built-in kv scorer prefers the emptiest).
* `last` (plugin type `last-endpoint-picker`): always the last replica of the list.
"""

from __future__ import annotations

from routing.pickers import register_picker, unregister_picker
from routing.scorers import register_scorer, unregister_scorer


def fullest(replicas, ctx) -> list[float]:
    return [r.kv_usage for r in replicas]


def last(router, replicas, hashes, session) -> int:
    return len(replicas) - 1


def register() -> None:
    register_scorer("fullest", "fullest-cache-scorer", fullest)
    register_picker("last", "last-endpoint-picker", last)


def unregister() -> None:
    unregister_scorer("fullest")
    unregister_picker("last")


register()
