"""Builders for the plain dicts the grouping rules read, and a fake API for owner lookups."""

from __future__ import annotations

import copy
from typing import Any

QUEUE = "kai.scheduler/queue"


def obj(api_version: str, kind: str, name: str, *, ns: str = "ns", uid: str | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        owners: list[dict[str, Any]] | None = None, spec: dict[str, Any] | None = None,
        status: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}"}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    if owners is not None:
        metadata["ownerReferences"] = owners
    o: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    if spec is not None:
        o["spec"] = spec
    if status is not None:
        o["status"] = status
    return o


def owned_by(owner: dict[str, Any]) -> dict[str, Any]:
    m = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": m["name"],
            "uid": m["uid"], "controller": True}


def pod(name: str = "p", *, owner: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        containers: list[dict[str, Any]] | None = None,
        scheduler: str = "kai-scheduler", **spec: Any) -> dict[str, Any]:
    body = {"schedulerName": scheduler,
            "containers": containers if containers is not None else [{"name": "main"}], **spec}
    return obj("v1", "Pod", name, labels=labels, annotations=annotations,
               owners=[owned_by(owner)] if owner else None, spec=body)


class FakeApi:
    """Objects by (kind, namespace, name); ``forbidden`` kinds or names read as None (HTTP 403)."""

    def __init__(self, *objects: dict[str, Any], forbidden: tuple[str, ...] = ()) -> None:
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o
                        for o in objects}
        self.forbidden = forbidden
        self.calls: list[tuple[str, str, str, str]] = []

    def get_owner(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append((api_version, kind, ns, name))
        if kind in self.forbidden or name in self.forbidden:
            return None
        try:
            found = copy.deepcopy(self.objects[(kind, ns, name)])
        except KeyError:
            raise LookupError(f"{kind} {ns}/{name} not found") from None
        found.pop("apiVersion", None)  # as in list items: the resolver must not need them
        found.pop("kind", None)
        return found


def worker_group(replicas: int | None = None, min_replicas: int | None = None, *,
                 name: str | None = None, hosts: int | None = None, **extra: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "worker"}]}}, **extra}
    for key, value in (("groupName", name), ("replicas", replicas), ("minReplicas", min_replicas),
                       ("numOfHosts", hosts)):
        if value is not None:
            g[key] = value
    return g


def ray_cluster(name: str = "rc", *groups: dict[str, Any], labels: dict[str, str] | None = None,
                **meta: Any) -> dict[str, Any]:
    spec = {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
            "workerGroupSpecs": list(groups)}
    return obj("ray.io/v1", "RayCluster", name, labels=labels, spec=spec, **meta)


def kuberay_pod(cluster: dict[str, Any], group: str, index: int = 0) -> dict[str, Any]:
    """A Ray pod as KubeRay's kai-scheduler plugin makes it: template metadata and spec, the
    ``ray.io/*`` labels, the cluster's queue label copied, schedulerName set, owned by the
    cluster."""
    spec = cluster["spec"]
    if group == "headgroup":
        template, node_type = spec["headGroupSpec"]["template"], "head"
    else:
        template = next(g["template"] for g in spec["workerGroupSpecs"] if g["groupName"] == group)
        node_type = "worker"
    tmeta = template.get("metadata") or {}
    cname = cluster["metadata"]["name"]
    labels = {**(tmeta.get("labels") or {}), "ray.io/cluster": cname,
              "ray.io/node-type": node_type, "ray.io/group": group, "ray.io/is-ray-node": "yes"}
    if cluster["metadata"].get("labels", {}).get(QUEUE):
        labels[QUEUE] = cluster["metadata"]["labels"][QUEUE]
    p = obj("v1", "Pod", f"{cname}-{group}-{index}", ns=cluster["metadata"]["namespace"],
            labels=labels, annotations=dict(tmeta.get("annotations") or {}),
            owners=[owned_by(cluster)],
            spec={**copy.deepcopy(template["spec"]), "schedulerName": "kai-scheduler"})
    return p
