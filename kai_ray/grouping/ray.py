"""Gang sizes of a RayCluster, as KAI's Ray grouper computes them.

``ray_gang(cluster) -> RayGang``: ``min_member`` = 1 (head) + Σ over worker groups of the
group minimum, and one subgroup per counted group after ``headgroup`` (minMember 1).

Per ``spec.workerGroupSpecs[i]``: skipped when suspended (KubeRay's ``suspend`` or KAI's
``suspended``); ``replicas`` and ``minReplicas`` default to 0, ``numOfHosts`` to 1;
``minReplicas > replicas`` is an error; skipped when both are 0; group minimum =
``minReplicas × numOfHosts`` if minReplicas > 0 else ``replicas × numOfHosts``
(``spec.enableInTreeAutoscaling`` is not consulted, as in KAI 72de64fc). The subgroup is
named ``groupName``, or ``worker-group-<i>`` when it is empty. Topology constraints come from the
group template's annotations ``kai.scheduler/topology`` and ``…-required-placement`` /
``…-preferred-placement`` (a placement without a topology name is an error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.grouping.config import (
    RAY_HEAD_GROUP,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
)
from kai_ray.grouping.objects import GroupingError, Obj, ref


@dataclass(frozen=True)
class RayGang:
    min_member: int
    # PodGroup spec.subGroups entries: {"name", "minMember"[, "topologyConstraint"]}
    subgroups: tuple[dict[str, Any], ...]
    # kai-ray: pods per replica of the subgroups with numOfHosts > 1 (a replica is placed whole)
    replica_hosts: tuple[tuple[str, int], ...] = ()


def _count(group: Mapping[str, Any], field: str, default: int, where: str) -> int:
    value = group.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GroupingError(f"{where}: {field} must be a non-negative integer, got {value!r}")
    return value


def _topology(template_owner: Mapping[str, Any], where: str) -> dict[str, str] | None:
    template = template_owner.get("template") or {}
    ann = (template.get("metadata") or {}).get("annotations") or {}
    required = ann.get(TOPOLOGY_REQUIRED_ANNOTATION, "")
    preferred = ann.get(TOPOLOGY_PREFERRED_ANNOTATION, "")
    if not required and not preferred:
        return None
    topology = ann.get(TOPOLOGY_ANNOTATION, "")
    if not topology:
        raise GroupingError(
            f"{where}: template annotation {TOPOLOGY_ANNOTATION} is required when a topology "
            "placement annotation is set"
        )
    constraint = {"topology": topology}
    if required:
        constraint["requiredTopologyLevel"] = required
    if preferred:
        constraint["preferredTopologyLevel"] = preferred
    return constraint


def _subgroup(name: str, min_member: int, topology: dict[str, str] | None) -> dict[str, Any]:
    sg: dict[str, Any] = {"name": name, "minMember": min_member}
    if topology:
        sg["topologyConstraint"] = topology
    return sg


def ray_gang(cluster: Obj) -> RayGang:
    """Gang minimum and subgroups of a RayCluster (see the module docstring)."""
    where = ref(cluster)
    spec = cluster.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise GroupingError(f"{where}: spec must be an object")
    head = spec.get("headGroupSpec") or {}
    subgroups = [_subgroup(RAY_HEAD_GROUP, 1, _topology(head, f"{where}: headGroupSpec"))]
    groups = spec.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        raise GroupingError(f"{where}: spec.workerGroupSpecs must be a list")
    total = 1
    replica_hosts: list[tuple[str, int]] = []
    for i, group in enumerate(groups):
        gwhere = f"{where}: workerGroupSpecs[{i}]"
        if not isinstance(group, Mapping):
            raise GroupingError(f"{gwhere}: must be an object")
        if group.get("suspend") is True or group.get("suspended") is True:
            continue
        replicas = _count(group, "replicas", 0, gwhere)
        min_replicas = _count(group, "minReplicas", 0, gwhere)
        if min_replicas > replicas:
            raise GroupingError(f"{gwhere}: minReplicas {min_replicas} > replicas {replicas}")
        if replicas == 0 and min_replicas == 0:
            continue
        hosts = _count(group, "numOfHosts", 1, gwhere)
        if hosts == 0:  # a subgroup needs minMember >= 1
            raise GroupingError(f"{gwhere}: numOfHosts must be at least 1, got 0")
        group_min = (min_replicas if min_replicas > 0 else replicas) * hosts
        total += group_min
        name = group.get("groupName") or f"worker-group-{i}"
        subgroups.append(_subgroup(str(name), group_min, _topology(group, gwhere)))
        if hosts > 1:
            replica_hosts.append((str(name), hosts))
    return RayGang(min_member=total, subgroups=tuple(subgroups),
                   replica_hosts=tuple(replica_hosts))
