"""Routing shared by the simulator and the live router: the filter-score-pick router, its registered
scorers and pickers, the prefix index, and the gateway's flow control. Torch-free; imports only
engine.core (the chained block hash)."""

import routing.precise  # noqa: F401  (registers the precise prefix scorer beside the built-in ones)
