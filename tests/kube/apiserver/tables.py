"""Server-side printing: the meta.k8s.io/v1 `Table` that `kubectl get` asks for, with a CRD's
additionalPrinterColumns (or a built-in type's usual columns) and the rows' object metadata."""

from __future__ import annotations

import calendar
import time

from tests.kube.apiserver.selectors import get_path

NAME = {"name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."}
AGE = {"name": "Age", "type": "string", "format": "", "priority": 0,
       "description": "CreationTimestamp is when the server created the object."}


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    s = int(time.time() - calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))
    if s < 120:
        return f"{max(s, 0)}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _col(name: str, type_: str = "string") -> dict:
    return {"name": name, "type": type_, "format": "", "priority": 0, "description": name}


def _builtin(kind: str):
    """(column definitions, cells(obj)) of the built-in kinds kubectl users look at here."""
    if kind in ("Deployment", "StatefulSet"):
        cols = [_col("Ready"), _col("Up-to-date", "integer"), _col("Available", "integer"), AGE]
        if kind == "StatefulSet":
            cols = [_col("Ready"), AGE]

        def cells(o):
            st, spec = o.get("status") or {}, o.get("spec") or {}
            ready = f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 0)}"
            if kind == "StatefulSet":
                return [ready, age(o["metadata"].get("creationTimestamp"))]
            return [ready, st.get("updatedReplicas", 0), st.get("availableReplicas", 0),
                    age(o["metadata"].get("creationTimestamp"))]
        return cols, cells
    if kind == "Pod":
        cols = [_col("Ready"), _col("Status"), _col("Restarts", "integer"), AGE]

        def cells(o):
            st = o.get("status") or {}
            ready = sum(1 for c in st.get("containerStatuses") or [] if c.get("ready"))
            total = len((o.get("spec") or {}).get("containers") or [])
            return [f"{ready}/{total}", st.get("phase", "Pending"), 0,
                    age(o["metadata"].get("creationTimestamp"))]
        return cols, cells
    return [AGE], lambda o: [age(o["metadata"].get("creationTimestamp"))]


def table(t, items: list[dict], rv: str, include_object: str = "Metadata") -> dict:
    if t.columns:
        cols = [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                 "description": c.get("description", ""), "priority": c.get("priority",
                                                                            0)} for c in t.columns]

        def cells(o):
            return [get_path(o, c["jsonPath"]) for c in t.columns]
    elif t.crd:
        cols, cells = [AGE], (lambda o: [age(o["metadata"].get("creationTimestamp"))])
    else:
        cols, cells = _builtin(t.kind)
    rows = []
    for o in items:
        if include_object == "Object":
            obj = o
        elif include_object == "None":
            obj = None
        else:
            obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
        rows.append({"cells": [o["metadata"]["name"], *cells(o)], "object": obj})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": [NAME, *cols], "rows": rows}
