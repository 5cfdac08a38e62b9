"""Reading Kubernetes objects given as plain camelCase dicts, and the grouping errors.

The grouping rules take objects exactly as the API server returns them (JSON, or the dynamic
client's ``.to_dict()``). Typed ``kubernetes`` models turned into dicts use snake_case keys; those
are rejected with a message saying how to convert them, instead of silently reading empty fields.

Public names:

- ``GroupingError``: bad or incomplete input; the message names the object and the field.
- ``OwnerExpired``: an ownerReference's UID does not match the live owner (KAI: "expired").
- ``RayClusterPending``: a RayJob/RayService has no RayCluster yet; retry later.
- ``ref(obj)``: ``"Kind ns/name"`` for messages.
- ``meta``, ``labels_of``, ``annotations_of``, ``name_uid``, ``api_group``, ``owner_ref``:
  field access with type checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]


class GroupingError(ValueError):
    """Input the grouper cannot turn into a PodGroup; the message names object and field."""


class OwnerExpired(GroupingError):
    """The owner named by an ownerReference was replaced by another object with the same name."""


class RayClusterPending(GroupingError):
    """The RayJob or RayService has not created its RayCluster yet (not a user error)."""


def ref(obj: Obj) -> str:
    """``Kind namespace/name`` (or ``Kind name`` for cluster-scoped objects) for messages."""
    m = obj.get("metadata") or {}
    ns, name = m.get("namespace"), m.get("name") or m.get("generateName") or "<unnamed>"
    kind = obj.get("kind") or "object"
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def meta(obj: Obj) -> Mapping[str, Any]:
    """``obj.metadata``; refuses snake_case dicts from typed kubernetes models."""
    if "api_version" in obj or "owner_references" in (obj.get("metadata") or {}):
        raise GroupingError(
            f"{ref(obj)}: snake_case keys (api_version/owner_references): pass the object as the "
            "API returns it (camelCase), e.g. ApiClient().sanitize_for_serialization(obj)"
        )
    m = obj.get("metadata")
    if not isinstance(m, Mapping):
        raise GroupingError(f"{ref(obj)}: metadata is missing or not an object")
    return m


def _str_map(obj: Obj, field: str) -> dict[str, str]:
    value = meta(obj).get(field) or {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise GroupingError(f"{ref(obj)}: metadata.{field} must map strings to strings")
    return dict(value)


def labels_of(obj: Obj) -> dict[str, str]:
    """A copy of ``metadata.labels`` (empty when absent)."""
    return _str_map(obj, "labels")


def annotations_of(obj: Obj) -> dict[str, str]:
    """A copy of ``metadata.annotations`` (empty when absent)."""
    return _str_map(obj, "annotations")


def name_uid(obj: Obj) -> tuple[str, str]:
    """``(metadata.name, metadata.uid)``; both are required for naming a PodGroup."""
    m = meta(obj)
    name, uid = m.get("name"), m.get("uid")
    if not isinstance(name, str) or not name:
        raise GroupingError(f"{ref(obj)}: metadata.name is missing")
    if not isinstance(uid, str) or not uid:
        raise GroupingError(f"{ref(obj)}: metadata.uid is missing")
    return name, uid


def api_group(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` → ``("apps", "v1")``; ``"v1"`` → ``("", "v1")``."""
    group, _, version = api_version.rpartition("/")
    return group, version


def owner_ref(obj: Obj) -> dict[str, str]:
    """An ownerReference pointing at ``obj`` (as KAI writes it: no controller flag)."""
    name, uid = name_uid(obj)
    return {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
            "name": name, "uid": uid}
