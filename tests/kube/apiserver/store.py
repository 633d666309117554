"""The stand-in's storage: objects by type, namespace and name; one resourceVersion counter for every
write (as etcd's revision); a bounded history of watch events; the status and scale subresources;
CRDs that register types; garbage collection by owner references and namespace deletion.

Every read hands out a copy; every write bumps the counter, stamps the object and wakes the watchers.
"""

from __future__ import annotations

import copy
import random
import re
import string
import threading
import time
import uuid
from collections import deque

from tests.kube.apiserver import schema as crdschema
from tests.kube.apiserver.errors import ApiError, already_exists, conflict, invalid, not_found
from tests.kube.apiserver.kinds import BUILTIN, ResourceType
from tests.kube.apiserver.selectors import get_path, match_fields, match_labels, selector_string, set_path

HISTORY = 5000  # watch events kept; a watch from an older resourceVersion gets 410 Gone
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def now_rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


class Store:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 1
        self.types: dict[tuple[str, str], ResourceType] = {t.key: t for t in copy.deepcopy(BUILTIN)}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {k: {} for k in self.types}
        self.history: deque = deque(maxlen=HISTORY)  # (rv, type key, namespace, type, obj, old)
        self.compacted = 1  # events with rv <= this are no longer in the history
        ns = self.types[("", "namespaces")]
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create(ns, "", {"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}})

    # -- types -----------------------------------------------------------------------------------
    def type_of(self, group: str, version: str, plural: str) -> ResourceType:
        t = self.types.get((group, plural))
        if t is None or t.version != version:
            raise ApiError(404, "the server could not find the requested resource")
        return t

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for t in self.types.values():
            if t.group == group and t.version == version and t.kind == kind:
                return t
        raise ApiError(404, f'no matches for kind "{kind}" in version "{api_version}"')

    # -- reads -----------------------------------------------------------------------------------
    def get(self, t: ResourceType, ns: str, name: str) -> dict:
        with self.cond:
            obj = self.objects[t.key].get((ns, name))
            if obj is None:
                raise not_found(t, name)
            return copy.deepcopy(obj)

    def list(self, t: ResourceType, ns: str | None, labels=(), fields=()) -> tuple[list[dict], str]:
        with self.cond:
            items = [copy.deepcopy(o) for (ons, _), o in sorted(self.objects[t.key].items())
                     if (ns is None or ons == ns) and self._matches(o, labels, fields)]
            return items, str(self.rv)

    @staticmethod
    def _matches(obj: dict | None, labels, fields) -> bool:
        return obj is not None and match_labels(labels, obj["metadata"].get("labels")) \
            and match_fields(fields, obj)

    # -- writes ----------------------------------------------------------------------------------
    def _bump(self, t: ResourceType, ns: str, kind: str, obj: dict, old: dict | None) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0][0]
        self.history.append((self.rv, t.key, ns, kind, copy.deepcopy(obj), old))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def _check_namespace(self, t: ResourceType, ns: str) -> None:
        if t.namespaced and ("", ns) not in self.objects[("", "namespaces")]:
            raise ApiError(404, f'namespaces "{ns}" not found',
                           details={"name": ns, "kind": "namespaces"})

    def create(self, t: ResourceType, ns: str, obj: dict, strict: bool = False) -> tuple[dict, list[str]]:
        """The created object and warnings (fields pruned)."""
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
                meta["name"] = meta["generateName"] + suffix
            name = meta.get("name", "")
            if not name:
                raise invalid(t, "", [("metadata.name", "Required value: name or generateName is required")])
            if not _NAME.match(name):
                raise invalid(t, name, [("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                                         "subdomain must consist of lower case alphanumeric characters, '-' "
                                         "or '.', and must start and end with an alphanumeric character")])
            if t.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(400, "the namespace of the provided object does not match the namespace "
                                        "sent on the request")
                meta["namespace"] = ns
                self._check_namespace(t, ns)
            else:
                meta.pop("namespace", None)
                ns = ""
            if (ns, name) in self.objects[t.key]:
                raise already_exists(t, name)
            obj["apiVersion"], obj["kind"] = t.group_version, t.kind
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            for key in ("resourceVersion", "deletionTimestamp", "managedFields", "selfLink"):
                meta.pop(key, None)
            if t.generation:
                meta["generation"] = 1
            if t.status:
                obj.pop("status", None)
            warnings = self._admit(t, obj, None, strict)
            self.objects[t.key][(ns, name)] = obj
            created = self._bump(t, ns, "ADDED", obj, None)
            if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._register(obj)
            return created, warnings

    def update(self, t: ResourceType, ns: str, name: str, obj: dict, subresource: str = "",
               strict: bool = False) -> tuple[dict, list[str]]:
        """PUT of the main resource or its status; the resourceVersion, when given, must be current."""
        with self.cond:
            ns = ns if t.namespaced else ""
            old = self.objects[t.key].get((ns, name))
            if old is None:
                raise not_found(t, name)
            meta = obj.get("metadata") or {}
            if meta.get("name") not in (None, name):
                raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name on "
                                    f"the URL ({name})")
            rv = meta.get("resourceVersion")
            if rv not in (None, "") and rv != old["metadata"]["resourceVersion"]:
                raise conflict(t, name)
            new = copy.deepcopy(obj)
            if subresource == "status":
                merged = copy.deepcopy(old)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                new = merged
            else:
                keep = {k: old["metadata"][k] for k in ("uid", "creationTimestamp", "generation", "namespace")
                        if k in old["metadata"]}
                new.setdefault("metadata", {}).update(keep)
                new["metadata"]["name"] = name
                new["apiVersion"], new["kind"] = t.group_version, t.kind
                if t.status:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
            warnings = self._admit(t, new, old, strict)
            if t.generation and subresource != "status" and _spec_of(new) != _spec_of(old):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            if _same(new, old):
                return copy.deepcopy(old), warnings  # a no-op write keeps the resourceVersion
            self.objects[t.key][(ns, name)] = new
            out = self._bump(t, ns, "MODIFIED", new, copy.deepcopy(old))
            if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._register(new)
            return out, warnings

    def delete(self, t: ResourceType, ns: str, name: str, uid: str | None = None,
               rv: str | None = None) -> dict:
        with self.cond:
            ns = ns if t.namespaced else ""
            obj = self.objects[t.key].get((ns, name))
            if obj is None:
                raise not_found(t, name)
            if uid and obj["metadata"]["uid"] != uid or rv and obj["metadata"]["resourceVersion"] != rv:
                raise conflict(t, name)
            del self.objects[t.key][(ns, name)]
            out = self._bump(t, ns, "DELETED", copy.deepcopy(obj), None)
            self._collect(t, obj)
            return out

    def _collect(self, t: ResourceType, obj: dict) -> None:
        """Garbage collection: dependents of a deleted owner, a namespace's objects, a CRD's resources."""
        uid = obj["metadata"]["uid"]
        if t.key == ("", "namespaces"):
            gone = [(tt, k) for tt in self.types.values() if tt.namespaced
                    for k in self.objects[tt.key] if k[0] == obj["metadata"]["name"]]
        elif t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            key = (obj["spec"]["group"], obj["spec"]["names"]["plural"])
            gone = [(self.types[key], k) for k in self.objects.get(key, {})] if key in self.types else []
        else:
            gone = [(tt, k) for tt in self.types.values() for k, o in self.objects[tt.key].items()
                    if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]
        for tt, (ons, oname) in gone:
            if (ons, oname) in self.objects[tt.key]:
                self.delete(tt, ons, oname)
        if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            key = (obj["spec"]["group"], obj["spec"]["names"]["plural"])
            self.types.pop(key, None)
            self.objects.pop(key, None)

    # -- admission: defaults and validation ---------------------------------------------------
    def _admit(self, t: ResourceType, obj: dict, old: dict | None, strict: bool) -> list[str]:
        name = obj["metadata"].get("name", "")
        warnings: list[str] = []
        if t.schema is not None:
            crdschema.apply_defaults(t.schema, obj)
            dropped = crdschema.prune(t.schema, obj, "", root=True)
            if dropped and strict:
                raise ApiError(400,
                               "strict decoding error: " + ", ".join(f'unknown field "{d}"' for d in dropped))
            warnings += [f'unknown field "{d}"' for d in dropped]
            errors = crdschema.validate(t.schema, obj, "")
            if errors:
                raise invalid(t, name, errors)
        check = STRATEGIES.get(t.kind)
        if check is not None:
            errors = check(obj, old)
            if errors:
                raise invalid(t, name, errors)
        if t.scale and t.schema is None:
            obj.setdefault("spec", {}).setdefault("replicas", 1)
        return warnings

    # -- the scale subresource ------------------------------------------------------------------
    def scale_of(self, t: ResourceType, obj: dict) -> dict:
        s = t.scale
        selector = get_path(obj, s["labelSelectorPath"]) if s.get("labelSelectorPath") else \
            selector_string(get_path(obj, ".spec.selector"))
        meta = obj["metadata"]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                  "creationTimestamp") if k in meta},
                "spec": {"replicas": get_path(obj, s["specReplicasPath"]) or 0},
                "status": {"replicas": get_path(obj, s["statusReplicasPath"]) or 0,
                           **({"selector": selector} if selector else {})}}

    def get_scale(self, t: ResourceType, ns: str, name: str) -> dict:
        if not t.scale:
            raise ApiError(404, "the server could not find the requested resource")
        return self.scale_of(t, self.get(t, ns, name))

    def update_scale(self, t: ResourceType, ns: str, name: str, scale: dict) -> dict:
        with self.cond:
            obj = self.get(t, ns, name)
            replicas = (scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise invalid(t, name, [("spec.replicas",
                                         f"Invalid value: {replicas!r}: must be greater than "
                                         f"or equal to 0")])
            rv = (scale.get("metadata") or {}).get("resourceVersion")
            if rv not in (None, "") and rv != obj["metadata"]["resourceVersion"]:
                raise conflict(t, name)
            set_path(obj, t.scale["specReplicasPath"], replicas)
            obj["metadata"].pop("resourceVersion")
            updated, _ = self.update(t, ns, name, obj)
            return self.scale_of(t, updated)

    # -- CRDs ------------------------------------------------------------------------------------
    def _register(self, crd: dict) -> None:
        spec = crd["spec"]
        version = next(v for v in spec["versions"] if v.get("storage"))
        sub = version.get("subresources") or {}
        names = spec["names"]
        t = ResourceType(spec["group"], version["name"], names["plural"], names["kind"],
                         spec.get("scope", "Namespaced") == "Namespaced", names.get("singular", ""),
                         list(names.get("shortNames") or []), "status" in sub, sub.get("scale"),
                         (version.get("schema") or {}).get("openAPIV3Schema"),
                         list(version.get("additionalPrinterColumns") or []), crd["metadata"]["name"])
        self.types[t.key] = t
        self.objects.setdefault(t.key, {})
        crd["status"] = {"acceptedNames": names, "storedVersions": [version["name"]], "conditions": [
            {"type": c, "status": "True", "reason": r, "message": m, "lastTransitionTime": now_rfc3339()}
            for c, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                            ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]}


def _spec_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _same(a: dict, b: dict) -> bool:
    strip = ("resourceVersion", "managedFields")
    ma = {k: v for k, v in a["metadata"].items() if k not in strip}
    mb = {k: v for k, v in b["metadata"].items() if k not in strip}
    return ma == mb and {k: v for k, v in a.items() if k != "metadata"} == \
        {k: v for k, v in b.items() if k != "metadata"}


# -- built-in types' own checks (a small part of the API server's validation) ----------------------
def _workload(obj: dict, old: dict | None) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    errors = []
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selector:
        errors.append(("spec.selector", "Required value"))
    elif not match_labels([(k, "=", {v}) for k, v in (selector.get("matchLabels") or {}).items()], labels):
        errors.append(("spec.template.metadata.labels", f"Invalid value: {labels}: `selector` does not match "
                                                        f"template `labels`"))
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        errors.append(("spec.selector", f"Invalid value: {selector}: field is immutable"))
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        errors.append(("spec.replicas", f"Invalid value: {replicas!r}: must be greater than or equal to 0"))
    return errors


def _crd(obj: dict, old: dict | None) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    errors = []
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if obj["metadata"]["name"] != expected:
        errors.append(("metadata.name",
                       f'Invalid value: "{obj["metadata"]["name"]}": must be spec.names.plural'
                                        f'+"."+spec.group'))
    versions = spec.get("versions") or []
    if sum(1 for v in versions if v.get("storage")) != 1:
        errors.append(("spec.versions",
                       "Invalid value: must have exactly one version marked as storage version"))
    for i, v in enumerate(versions):
        s = (v.get("schema") or {}).get("openAPIV3Schema")
        if s is None:
            errors.append((f"spec.versions[{i}].schema.openAPIV3Schema",
                           "Required value: schemas are required"))
            continue
        for e in crdschema.crd_schema_errors(s, f"spec.versions[{i}].schema.openAPIV3Schema"):
            if e.startswith("json: "):  # a wrong JSON type fails decoding before any validation
                raise ApiError(400, f'CustomResourceDefinition in version "v1" cannot be handled as a '
                                    f'CustomResourceDefinition: {e}')
            errors.append(("", e))
    return errors


STRATEGIES = {"Deployment": _workload, "StatefulSet": _workload, "CustomResourceDefinition": _crd}
