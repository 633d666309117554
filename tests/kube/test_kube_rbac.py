"""Least privilege, proven: over the whole kube suite, the (verb, group, resource, subresource) of
every request the controller made (the stand-ins' audit logs, by its user agent) equals what the
ClusterRole and Role in deploy/base grant: nothing used that is not granted (the stand-in enforces
RBAC, so such a request would have been refused), nothing granted that is never used."""

from __future__ import annotations

import pytest

from tests.kube.helpers import SESSION_AUDIT, is_controller, render

TEST_GRANTED = {"inference.example.com"}  # a kind the tests grant themselves, as a user would add one


def granted() -> set[tuple[str, str, str, str]]:
    out = set()
    for doc in render("base"):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    resource, _, sub = res.partition("/")
                    out |= {(verb, group, resource, sub) for verb in rule["verbs"]}
    return out


@pytest.mark.audit_last
def test_the_audit_log_uses_exactly_what_rbac_grants(request):
    kube_tests = [i for i in request.session.items if "tests/kube/" in i.nodeid.replace("\\", "/")
                  and i.get_closest_marker("slow") is None and i is not request.node]
    ran = {i.nodeid for i in kube_tests}
    modules = {p.name for p in (request.path.parent).glob("test_kube_*.py")} - {request.path.name}
    if {m for m in modules if not any(m in n for n in ran)}:
        pytest.skip("the least-privilege check reads the audit of the whole tests/kube suite: run all of it")
    entries = [e for e in SESSION_AUDIT if is_controller(e) and e["resource"]]
    if not entries:
        pytest.xfail("no controller request in this session (the kube tests did not run)")
    used = {(e["verb"], e["group"], e["resource"], e["subresource"]) for e in entries
            if e["group"] not in TEST_GRANTED}
    denied = sorted({(e["verb"], e["resource"], e["subresource"]) for e in entries if e["code"] == 403})
    grants = granted()
    print(f"{len(entries)} controller requests; {len(used)} distinct (verb, group, resource, subresource)")
    for g in sorted(grants):
        print("  granted and used:" if g in used else "  GRANTED, NEVER USED:", g)
    assert not denied, f"refused by RBAC: {denied}"
    assert used - grants == set(), f"used but not granted: {sorted(used - grants)}"
    assert grants - used == set(), f"granted but never used: {sorted(grants - used)}"
