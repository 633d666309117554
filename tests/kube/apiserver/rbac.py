"""Authentication by bearer token and RBAC authorization over the stored roles and bindings, as the
API server's RBAC authorizer decides: a request is allowed when some binding that names the user, one
of its groups or its service account grants the verb on the resource (and subresource, name)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.kube.apiserver.errors import ApiError


@dataclass
class User:
    name: str
    groups: list[str] = field(default_factory=list)
    pod: str = ""  # a pod-bound ServiceAccount token names its pod (the audit log shows it)


ADMIN = User("admin", ["system:masters", "system:authenticated"])


def service_account(namespace: str, name: str, pod: str = "") -> User:
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    return User(f"system:serviceaccount:{namespace}:{name}", groups, pod)


def _subject_matches(subject: dict, user: User) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace')}:{subject.get('name')}"
    return False


def _rule_allows(rule: dict, verb: str, group: str, resource: str, sub: str, name: str) -> bool:
    if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
        return False
    groups = rule.get("apiGroups", [])
    if group not in groups and "*" not in groups:
        return False
    wanted = f"{resource}/{sub}" if sub else resource
    resources = rule.get("resources", [])
    if not (wanted in resources or "*" in resources or (sub and f"*/{sub}" in resources)):
        return False
    names = rule.get("resourceNames")
    return not names or name in names


def allowed(store, user: User, verb: str, group: str, resource: str, sub: str, namespace: str,
            name: str) -> bool:
    """Whether RBAC (system:masters aside) lets `user` do `verb` on the resource."""
    if "system:masters" in user.groups:
        return True
    rbac = "rbac.authorization.k8s.io"

    def rules_of(ref: dict, ns: str) -> list[dict]:
        if ref.get("kind") == "ClusterRole":
            role = store.objects[(rbac, "clusterroles")].get(("", ref.get("name")))
        else:
            role = store.objects[(rbac, "roles")].get((ns, ref.get("name")))
        return (role or {}).get("rules") or []

    with store.cond:
        bindings = [(b, "") for b in store.objects[(rbac, "clusterrolebindings")].values()]
        if namespace:
            bindings += [(b, namespace) for (ns, _), b in store.objects[(rbac, "rolebindings")].items()
                         if ns == namespace]
        for binding, ns in bindings:
            if not any(_subject_matches(s, user) for s in binding.get("subjects") or []):
                continue
            for rule in rules_of(binding.get("roleRef") or {}, ns):
                if _rule_allows(rule, verb, group, resource, sub, name):
                    return True
    return False


def forbidden(user: User, verb: str, group: str, resource: str, sub: str, namespace: str,
              name: str) -> ApiError:
    what = f"{resource}/{sub}" if sub else resource
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    named = f' "{name}"' if name else ""
    return ApiError(403,
                    f'{what}{"." + group if group else ""}{named} is forbidden: User "{user.name}" cannot '
                         f'{verb} resource "{what}" in API group "{group}"{where}',
                    details={"name": name, "group": group, "kind": resource})
