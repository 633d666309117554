"""Who else scales a target: an HPA, a KEDA ScaledObject (not handed to us), or another autoscaler we
run. The first two always win; between our own, the oldest (then the name) keeps the target. An
autoscaler that loses is refused with a condition and an Event, and never acts."""

from __future__ import annotations

from controlplane.kube.kinds import target_ref


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _same_target(ref: dict, group: str, kind: str, name: str) -> bool:
    return ref.get("name") == name and (ref.get("kind") or "Deployment") == kind and \
        _group(ref.get("apiVersion") or "apps/v1") == group


def _age_key(obj: dict) -> tuple:
    meta = obj.get("metadata") or {}
    return meta.get("creationTimestamp") or "", meta.get("name", ""), obj.get("kind", "")


def owner_conflict(me: dict, hpas: list[dict], scaled_objects: list[dict], ours: list[dict],
                   handed_to_us=lambda so: False) -> tuple[str, str] | None:
    """(reason, message) when `me`'s target belongs to someone else, else None.

    hpas, scaled_objects: those in the cluster; ours: the autoscalers this controller runs (`me` too);
    handed_to_us(so): whether a ScaledObject is one of ours (then KEDA is not running it)."""
    ns = (me.get("metadata") or {}).get("namespace", "")
    api_version, kind, name = target_ref(me)
    group = _group(api_version)
    what = f"{kind}/{name}"

    def here(o: dict) -> bool:
        return (o.get("metadata") or {}).get("namespace", "") == ns

    for hpa in hpas:
        if here(hpa) and _same_target((hpa.get("spec") or {}).get("scaleTargetRef") or {}, group, kind, name):
            owners = [r for r in (hpa.get("metadata") or {}).get("ownerReferences") or []
                      if r.get("kind") == "ScaledObject"]
            by = f"ScaledObject {owners[0]['name']} (through HPA {hpa['metadata']['name']})" if owners else \
                f"HorizontalPodAutoscaler {hpa['metadata']['name']}"
            return "TargetOwnedByHPA", f"{what} is already scaled by {by}"
    for so in scaled_objects:
        if here(so) and not handed_to_us(so) and \
                _same_target((so.get("spec") or {}).get("scaleTargetRef") or {}, group, kind, name):
            return "TargetOwnedByScaledObject", f"{what} is already scaled by KEDA ScaledObject " \
                                                f"{so['metadata']['name']}"
    rivals = [o for o in ours if here(o) and target_ref(o)[1:] == (kind, name) and
              _group(target_ref(o)[0]) == group]
    if rivals:
        first = min(rivals, key=_age_key)
        if _age_key(first) != _age_key(me):
            return "TargetOwnedByInferenceAutoscaler", f"{what} is already scaled by {first.get('kind')} " \
                                                       f"{first['metadata']['name']}"
    return None
