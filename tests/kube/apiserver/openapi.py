"""The OpenAPI v3 documents kubectl reads: the root (one URL per group/version, with a hash that
changes when the types do) and per group/version the PATCH operations, which state that the server
validates fields itself (`fieldValidation`), so kubectl leaves validation to the server. A CRD's
schema is published as the component of its kind (`kubectl explain`)."""

from __future__ import annotations

import hashlib
import json

MERGE_TYPES = ["application/json-patch+json", "application/merge-patch+json"]


def _gv_path(t) -> str:
    return f"api/{t.version}" if not t.group else f"apis/{t.group}/{t.version}"


def _gvk(t) -> dict:
    return {"group": t.group, "version": t.version, "kind": t.kind}


def gv_document(types, gv_path: str) -> dict | None:
    mine = [t for t in types if _gv_path(t) == gv_path]
    if not mine:
        return None
    paths, schemas = {}, {}
    params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
              for n in ("dryRun", "fieldManager", "fieldValidation")]
    for t in mine:
        base = "/" + gv_path + ("/namespaces/{namespace}" if t.namespaced else "")
        name = f"{t.group or 'core'}.{t.version}.{t.kind}"
        ref = {"$ref": f"#/components/schemas/{name}"}
        body = {"content": {ct: {"schema": {"type": "object"}} for ct in MERGE_TYPES}, "required": True}
        op = {"x-kubernetes-group-version-kind": _gvk(t), "x-kubernetes-action": "patch",
              "parameters": params,
              "requestBody": body, "responses": {"200": {"description": "OK",
                                                         "content": {"application/json": {"schema": ref}}}}}
        get = {"x-kubernetes-group-version-kind": _gvk(t), "x-kubernetes-action": "get",
               "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}}
        paths[f"{base}/{t.plural}/{{name}}"] = {"get": get, "patch": op}
        for sub in (["status"] if t.status else []) + (["scale"] if t.scale else []):
            paths[f"{base}/{t.plural}/{{name}}/{sub}"] = {"patch": {**op, "x-kubernetes-action": "patch"}}
        schema = dict(t.schema) if t.schema else {"type": "object",
                                                  "x-kubernetes-preserve-unknown-fields": True}
        schema["x-kubernetes-group-version-kind"] = [_gvk(t)]
        schemas[name] = schema
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths,
            "components": {"schemas": schemas}}


def document(store, path: str) -> dict | None:
    types = list(store.types.values())
    if path == "/openapi/v3":
        out = {}
        for gv in sorted({_gv_path(t) for t in types}):
            digest = hashlib.sha256(json.dumps(gv_document(types, gv), sort_keys=True).encode()).hexdigest()
            out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest[:32].upper()}"}
        return {"paths": out}
    if path.startswith("/openapi/v3/"):
        return gv_document(types, path[len("/openapi/v3/"):])
    return None
