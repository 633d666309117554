"""A live trigger whose query keeps returning no series is said, by name, with what does exist.

KEDA reads an empty answer as 0 (ignoreNullValues), so a trigger filtering on a label value the
engines do not export (`{model_name="llama-70b"}` against `llama2-70b`) scales on nothing and the
fleet looks merely quiet. The simulator reports such a trigger at the end of a run
(simulator.trigger_watch); a controller has no end, so here a trigger that returned an empty result
`polls` polls in a row is logged once at warning, with the label values present for each metric its
query selects (a "did you mean"), and its first sample after that at info. A failed query is not
empty: it is the source health's business (controlplane.source_health).
"""

from __future__ import annotations

import logging

from promql.parse import Selector, compile_query
from promql.tree import walk
from simulator.trigger_watch import selector_hint

log = logging.getLogger("slopilot.control")


def query_hint(query: str, source) -> str:
    """Why `query` selects nothing, from the series the source holds for each metric it names."""
    hints = []
    try:
        selectors = [n for n in walk(compile_query(query)) if isinstance(n, Selector)]
    except ValueError as exc:
        return f"its query does not parse: {exc}"
    for sel in selectors:
        try:  # the bare metric name: every series of that metric, whatever its labels
            labels = [lb for lb, _ in source.query(sel.name)] if sel.name else []
        except Exception as exc:  # the hint is a courtesy: a failure to read it is said, not raised
            hints.append(f"(could not list the {sel.name} series: {exc})")
            continue
        named = [tuple(sorted({**dict(lb), "__name__": sel.name}.items())) for lb in labels]
        hint = selector_hint(sel, named)
        if hint:
            hints.append(hint)
    return "; ".join(hints) or "its series exist, but the query filtered every sample out"


class TriggerSilence:
    """Per trigger, the polls in a row whose query returned an empty result."""

    def __init__(self, name: str, triggers, polls: int):
        if polls < 1:
            raise ValueError(f"silent polls: must be >= 1, got {polls}")
        self.name, self.polls = name, polls
        self.queries = {t.name: t.query for t in triggers if getattr(t, "query", None)}
        self.empty: dict[str, int] = {t: 0 for t in self.queries}
        self.reported: set[str] = set()

    def update(self, obs, source) -> list[str]:
        """After a tick: count empty results; returns the messages logged now (warnings first)."""
        said = []
        for trig, query in self.queries.items():
            if trig in obs.errors or trig not in obs.metrics:
                continue  # failed or not read: not evidence of an empty match
            if obs.metrics[trig] is None:
                self.empty[trig] += 1
                if self.empty[trig] == self.polls and trig not in self.reported:
                    self.reported.add(trig)
                    msg = (f"{self.name}: trigger {trig!r} matched nothing for {self.polls} polls in a row "
                           f"({query}), read as 0: {query_hint(query, source)}")
                    log.warning(msg)
                    said.append(msg)
            else:
                if trig in self.reported:
                    msg = f"{self.name}: trigger {trig!r} matches again after {self.empty[trig]} empty polls"
                    log.info(msg)
                    said.append(msg)
                    self.reported.discard(trig)
                self.empty[trig] = 0
        return said

    def silent(self) -> list[str]:
        """The triggers reported as matching nothing, still silent."""
        return sorted(self.reported)
