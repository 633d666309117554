"""The router's pickers, registered beside the scorers (routing.scorers): each takes the router (its
turn counter, seeded generator, prefix index, sessions, thresholds), the replicas, the request's prefix
hashes and session, and returns the index of the chosen replica. `Router.pick` looks its picker up
here; a new picker is one register_picker() call in its own module.
"""

from __future__ import annotations

from typing import Callable

from routing.scorers import SCORERS, Plugin, below_thresholds

Picker = Callable[..., int]  # (router, replicas, hashes, session) -> index

PICKERS: dict[str, Plugin] = {}
# the scenario's router.policy enum (simulator.scenario_schema holds this list): the picker names
POLICY_NAMES: list[str] = []


def register_picker(name: str, plugin_type: str | None, fn: Picker, *, uses_prefix: bool = False) -> Plugin:
    """Add a picker: a scenario's router.policy, and an EndpointPickerConfig plugin (when plugin_type)."""
    if name in PICKERS:
        raise ValueError(f"picker {name!r} is registered already")
    plugin = PICKERS[name] = Plugin(name, plugin_type, fn, uses_prefix)
    POLICY_NAMES.append(name)
    return plugin


def unregister_picker(name: str) -> None:
    if PICKERS.pop(name, None) is not None:
        POLICY_NAMES.remove(name)


def round_robin(router, replicas, hashes, session) -> int:
    i = router._turn % len(replicas)
    router._turn += 1
    return i


def prefix_affinity(router, replicas, hashes, session) -> int:
    # longest cached prefix wins among replicas not much busier than the least loaded one
    # (bounded load: a prefix every request shares, like a system prompt, must not pin them all)
    loads = [r.outstanding for r in replicas]
    bound = min(loads) * router.load_slack + router.load_margin
    if hashes:
        cands = [i for i, v in enumerate(loads) if v <= bound]
        matches = [router.index.match(replicas[i].id, hashes) for i in cands]
        best = max(matches)
        if best > 0:
            cands = [c for c, m in zip(cands, matches) if m == best]
            low = min(loads[c] for c in cands)
            return router._tie([c for c in cands if loads[c] == low])
    return router._argmin(loads)


def weighted(router, replicas, hashes, session) -> int:
    """llm-d's filter-score-pick: drop saturated replicas (unless all are), the best weighted sum of
    the scorers, ties in turn or at random."""
    keep = below_thresholds(replicas, router.kv_threshold, router.queue_threshold)
    cand_idx = keep or list(range(len(replicas)))
    cands = [replicas[i] for i in cand_idx]
    ctx = {"match": lambda r: router.index.match(r.id, hashes) / len(hashes) if hashes else 0.0,
           "hashes": hashes, "kv_index": router.kv_index}
    if router.sessions is not None and session is not None:
        ctx["session"] = router.sessions.get(session)
    total = [0.0] * len(cands)
    for name, w in router.weights.items():
        if w:
            for j, s in enumerate(SCORERS[name](cands, ctx)):
                total[j] += w * s
    best = max(total)
    return cand_idx[router._tie([j for j, t in enumerate(total) if t == best])]


register_picker("round_robin", "round-robin-picker", round_robin)
register_picker("random", "random-picker", lambda router, reps, h, s: int(router.rng.integers(len(reps))))
register_picker("least_outstanding", "least-outstanding-picker",
                lambda router, reps, h, s: router._argmin([r.outstanding for r in reps]))
register_picker("least_waiting", None,  # the shortest engine queue, then the fewest outstanding
                lambda router, reps, h, s: router._argmin([r.num_waiting * 1_000_000 + r.outstanding
                                                           for r in reps]))
register_picker("kv_aware", None, lambda router, reps, h, s: router._argmin([r.kv_usage for r in reps]))
register_picker("prefix_affinity", "prefix-affinity-picker", prefix_affinity, uses_prefix=True)
register_picker("weighted", "max-score-picker", weighted)
