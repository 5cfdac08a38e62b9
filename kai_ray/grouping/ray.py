"""Gang sizes of a RayCluster: KAI's Ray grouper rule, except for autoscaled groups with
``minReplicas: 0``.

``ray_gang(cluster) -> RayGang``: ``min_member`` = 1 (head) + Σ over worker groups of the
group minimum, one subgroup per group with a minimum above 0 after ``headgroup`` (minMember 1),
and ``elastic``: the groups whose minimum is 0 (their pods are all above the gang minimum).

Per ``spec.workerGroupSpecs[i]``: skipped when suspended (KubeRay's ``suspend`` or KAI's
``suspended``); ``replicas`` and ``minReplicas`` default to 0, ``numOfHosts`` to 1;
``minReplicas > replicas`` is an error. The group minimum:

- with in-tree autoscaling (``spec.enableInTreeAutoscaling: true``; a RayJob's or RayService's
  RayCluster carries its ``rayClusterSpec`` unchanged): ``minReplicas × numOfHosts``, also when
  that is 0. kai-ray deviates from KAI here (KAI 72de64fc does not read the flag and counts
  ``replicas`` when minReplicas is 0): the autoscaler writes ``replicas`` to ask for more
  workers than may fit, and a gang minimum following it would place none of them and leave the
  running gang below its minimum. KubeRay's own Volcano integration counts minReplicas the same
  way when autoscaling is on. A group whose minimum is 0 is listed in ``elastic`` even with no
  replicas, so the autoscaler's next scale-up needs no PodGroup change.
- without it, KAI's rule: ``minReplicas × numOfHosts`` if minReplicas > 0, else
  ``replicas × numOfHosts``, and a group with neither is skipped. There ``replicas`` is what the
  user asked to run and minReplicas 0 is only the CRD's default, so the whole cluster stays one
  gang, as in KAI (and in KubeRay's Volcano integration, which then counts every replica).

A subgroup needs minMember >= 1 (the CRD's minimum), so an elastic group gets none in
``spec.subGroups``; the pod grouper lists it in the PodGroup annotation
``kai-ray.io/elastic-subgroups`` instead and still labels its pods with the subgroup name, and
the scheduler reads it as a subgroup of minimum 0.

Subgroups are named ``groupName``, or ``worker-group-<i>`` when it is empty. Topology
constraints come from the group template's annotations ``kai.scheduler/topology`` and
``…-required-placement`` / ``…-preferred-placement`` (a placement without a topology name is an
error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.api_names import (
    ELASTIC_SUBGROUPS_ANNOTATION,
    RAY_HEAD_GROUP,
    REPLICA_HOSTS_ANNOTATION,
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
    # kai-ray: autoscaled groups with minReplicas 0, in spec order: no subgroup, every pod elastic
    elastic: tuple[str, ...] = ()


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
    elastic: list[str] = []
    autoscaling = spec.get("enableInTreeAutoscaling") is True
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
        if replicas == 0 and min_replicas == 0 and not autoscaling:
            continue
        hosts = _count(group, "numOfHosts", 1, gwhere)
        if hosts == 0:  # a subgroup needs minMember >= 1, a replica at least one pod
            raise GroupingError(f"{gwhere}: numOfHosts must be at least 1, got 0")
        name = str(group.get("groupName") or f"worker-group-{i}")
        topology = _topology(group, gwhere)
        if hosts > 1:
            replica_hosts.append((name, hosts))
        if autoscaling:
            # the autoscaler owns `replicas` (it asks for what may not fit): only the
            # minimum the user set is the gang's
            group_min = min_replicas * hosts
            if group_min == 0:
                elastic.append(name)
                continue
        else:
            # KAI's rule: with no autoscaler sizing `replicas` to what fits, it is the cluster
            # the user asked for (minReplicas 0 is just the CRD default): all of it is the gang
            group_min = (min_replicas if min_replicas > 0 else replicas) * hosts
        total += group_min
        subgroups.append(_subgroup(name, group_min, topology))
    return RayGang(min_member=total, subgroups=tuple(subgroups),
                   replica_hosts=tuple(replica_hosts), elastic=tuple(elastic))


def gang_annotations(gang: RayGang) -> dict[str, str]:
    """The grouper's own PodGroup annotations for ``gang`` (none when it needs none)."""
    out: dict[str, str] = {}
    if gang.replica_hosts:
        out[REPLICA_HOSTS_ANNOTATION] = json.dumps(dict(gang.replica_hosts), sort_keys=True)
    if gang.elastic:
        out[ELASTIC_SUBGROUPS_ANNOTATION] = json.dumps(list(gang.elastic))
    return out
