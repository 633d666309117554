"""Triggers whose query never matched a series over a run, said by name with what does exist.

KEDA reads an empty answer as 0 (ignoreNullValues), so a trigger filtering on a label value the
engines do not export (`{model_name="llama-70b"}` against `llama2-70b`) scales on nothing and the
run looks merely under-provisioned. Every evaluation that returns a sample marks its trigger as
matched; at the end of the run each trigger never marked is reported with, for every selector of its
query that selects nothing, the label values present for that metric and the closest one ("did you
mean").

    for w in unmatched_triggers(fleet): print(w["message"])
"""

from __future__ import annotations

import difflib

from promql.parse import Selector, compile_query
from promql.tree import walk


def all_labels(store) -> list[tuple]:
    """The labels of every series the store holds now (scraped targets and recording rules' output)."""
    out = [c.labels for t in store.targets.targets.values() for c in t.columns]
    return out + list(store.recorded.series)


def selector_hint(sel: Selector, labels: list[tuple]) -> str | None:
    """Why this selector selects nothing, from the series present; None when it selects some."""
    name = sel.name
    same = [dict(lb) for lb in labels if name is None or dict(lb).get("__name__") == name]
    if not same:
        names = sorted({dict(lb).get("__name__", "") for lb in labels})
        close = difflib.get_close_matches(name or "", names, n=1)
        return f"no series is named {name}" + (f" (did you mean {close[0]}?)" if close else "")
    if any(all(m.matches(d.get(m.name, "")) for m in sel.matchers) for d in same):
        return None
    parts = []
    for m in sel.matchers:
        if m.name == "__name__" or any(m.matches(d.get(m.name, "")) for d in same):
            continue
        values = sorted({d.get(m.name, "") for d in same} - {""})
        shown = ", ".join(f'{m.name}="{v}"' for v in values[:8]) or f"no {m.name} label"
        text = f'{name} has {shown}, none {m.name}{m.op}"{m.value}"'
        close = difflib.get_close_matches(m.value, values, n=1, cutoff=0.5) if m.op == "=" else []
        if close:
            text += f' (did you mean {m.name}="{close[0]}"?)'
        parts.append(text)
    return "; ".join(parts) or f"no single {name} series matches all of its labels"


def unmatched_triggers(fleet) -> list[dict]:
    """Each pool's triggers that returned no sample at any evaluation of the run, with a hint."""
    out = []
    labels = None
    for pool in fleet.pools:
        pp = getattr(pool, "policy", None)
        for trig_name, _ in (pp.queries if pp and pp.evaluations else []):
            if trig_name in pp.matched:
                continue
            trig = next(t for t in pp.triggers if t.name == trig_name)
            labels = all_labels(fleet.store) if labels is None else labels
            hints = [h for h in (selector_hint(n, labels) for n in walk(compile_query(trig.query))
                                 if isinstance(n, Selector)) if h]
            why = "; ".join(hints) or "its series exist, but the query filtered every sample out"
            out.append({"pool": pool.spec.name, "trigger": trig_name, "query": trig.query, "hint": why,
                        "message": f"pool {pool.spec.name}: trigger {trig_name!r} matched nothing over the "
                                   f"whole run ({trig.query}): {why}"})
    return out
