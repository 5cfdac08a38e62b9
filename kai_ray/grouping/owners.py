"""Top-owner resolution as a pure step (KAI's podgrouper rules).

``resolve_top_owner(pod, get_owner) -> Owners``

The caller does the API reads through ``get_owner(apiVersion, kind, namespace, name)``:

- return the object (a camelCase dict) when it can be read;
- return ``None`` when it may not be read (HTTP 403): the walk stops at the last owner that could
  be read, or at the pod itself, as KAI does;
- raise for anything else (NotFound included): KAI treats those as errors and retries later.

Rules: follow the pod's ``ownerReferences[0]``, then each owner's single ownerReference, to the
object without owners. An owner with more than one ownerReference is an error. An owner whose UID
differs from the reference is ``OwnerExpired``. A pod without owners is its own top owner.

For Ray top owners the RayCluster that sizes the gang is looked up too (``Owners.ray_cluster``):
the RayCluster itself, a RayJob's ``status.rayClusterName``, or a RayService's
``status.activeServiceStatus.rayClusterName``, falling back to
``status.pendingServiceStatus.rayClusterName`` only when the active status has no such field
(present but empty stops the search). No name yet raises ``RayClusterPending``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kai_ray.grouping.objects import (
    GroupingError,
    Obj,
    OwnerExpired,
    RayClusterPending,
    api_group,
    meta,
    name_uid,
    ref,
)

GetOwner = Callable[[str, str, str, str], Mapping[str, Any] | None]

RAY_GROUP = "ray.io"
RAY_VERSIONS = ("v1", "v1alpha1")


@dataclass(frozen=True)
class Owners:
    """The top owner, the owners walked (nearest first, ending at ``top`` unless the walk fell
    back to the pod) and, for Ray kinds, the RayCluster that sizes the gang."""

    top: Mapping[str, Any]
    chain: Sequence[Mapping[str, Any]]
    ray_cluster: Mapping[str, Any] | None = None


def as_pod(pod: Obj) -> dict[str, Any]:
    """The pod with ``apiVersion``/``kind`` filled in (list responses omit them on items)."""
    return {**pod, "apiVersion": pod.get("apiVersion") or "v1", "kind": pod.get("kind") or "Pod"}


def _owner_refs(obj: Obj) -> list[Mapping[str, Any]]:
    refs = meta(obj).get("ownerReferences") or []
    if not isinstance(refs, list) or not all(isinstance(r, Mapping) for r in refs):
        raise GroupingError(f"{ref(obj)}: metadata.ownerReferences must be a list of objects")
    for i, r in enumerate(refs):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(r.get(field), str) or not r.get(field):
                raise GroupingError(f"{ref(obj)}: metadata.ownerReferences[{i}].{field} is missing")
    return list(refs)


def resolve_top_owner(pod: Obj, get_owner: GetOwner) -> Owners:
    """Walk the owner chain of ``pod`` (see the module docstring)."""
    pod = as_pod(pod)
    namespace = meta(pod).get("namespace") or ""
    name_uid(pod)
    refs = _owner_refs(pod)
    chain: list[Mapping[str, Any]] = []
    source: Obj = pod
    while refs:
        if source is not pod and len(refs) > 1:
            names = ", ".join(f"{r['kind']} {r['name']}" for r in refs)
            raise GroupingError(
                f"{ref(source)}: metadata.ownerReferences has {len(refs)} owners ({names}); "
                "an intermediate owner must have exactly one"
            )
        r = refs[0]
        owner = get_owner(r["apiVersion"], r["kind"], namespace, r["name"])
        if owner is None:  # forbidden: stop at the last readable object
            top = chain[-1] if chain else pod
            return _with_ray_cluster(Owners(top=top, chain=chain), get_owner)
        owner = {"apiVersion": r["apiVersion"], "kind": r["kind"], **owner}
        if (meta(owner).get("uid") or "") != r["uid"]:
            raise OwnerExpired(
                f"{ref(source)}: ownerReferences[0] {r['kind']} {namespace}/{r['name']} has uid "
                f"{meta(owner).get('uid')!r}, the reference says {r['uid']!r} (owner expired)"
            )
        chain.append(owner)
        source, refs = owner, _owner_refs(owner)
    top = chain[-1] if chain else pod
    return _with_ray_cluster(Owners(top=top, chain=chain), get_owner)


def is_ray_kind(obj: Obj, *kinds: str) -> bool:
    group, version = api_group(str(obj.get("apiVersion", "")))
    return group == RAY_GROUP and version in RAY_VERSIONS and obj.get("kind") in kinds


def ray_cluster_name(top: Obj) -> str:
    """The name of the RayCluster a RayJob or RayService runs on; ``RayClusterPending`` if none."""
    status = top.get("status") or {}
    if top.get("kind") == "RayJob":
        name, field = status.get("rayClusterName"), "status.rayClusterName"
    else:
        active = status.get("activeServiceStatus") or {}
        if "rayClusterName" in active:
            name, field = active["rayClusterName"], "status.activeServiceStatus.rayClusterName"
        else:
            pending = status.get("pendingServiceStatus") or {}
            name = pending.get("rayClusterName")
            field = "status.pendingServiceStatus.rayClusterName"
    if not isinstance(name, str) or not name:
        raise RayClusterPending(
            f"{ref(top)}: {field} is not set: make sure the ray-operator is up and has created "
            "the RayCluster"
        )
    return name


def _with_ray_cluster(owners: Owners, get_owner: GetOwner) -> Owners:
    top = owners.top
    if is_ray_kind(top, "RayCluster"):
        return Owners(owners.top, owners.chain, ray_cluster=top)
    if not is_ray_kind(top, "RayJob", "RayService"):
        return owners
    name = ray_cluster_name(top)
    namespace = meta(top).get("namespace") or ""
    cluster = get_owner(str(top["apiVersion"]), "RayCluster", namespace, name)
    if cluster is None:
        raise GroupingError(f"{ref(top)}: RayCluster {namespace}/{name} cannot be read")
    cluster = {"apiVersion": top["apiVersion"], "kind": "RayCluster", **cluster}
    return Owners(owners.top, owners.chain, ray_cluster=cluster)
