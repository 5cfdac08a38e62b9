"""What a snapshot read from the cached API objects into the core's model, kept from one
snapshot to the next: an object the watch has not replaced (the very same object: the cache
never edits one in place) is not read again. Between two cycles few objects change, and
reading every pod, node and job again was most of a snapshot's time on a big cluster.

Each holder keeps per object key what was read and from what; what a snapshot did not look up
(objects gone, or left out) is dropped by `forget_unseen()` at its end."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from kai_ray.core.model import Job, Node, Pod
from kai_ray.k8s import convert

Obj = dict[str, Any]
V = TypeVar("V")


def object_key(obj: Obj) -> str:
    m = obj.get("metadata") or {}
    ns = m.get("namespace")
    return f"{ns}/{m['name']}" if ns else m["name"]


class Kept(Generic[V]):
    """Values kept per object key; those a snapshot did not look up are dropped at its end."""

    def __init__(self) -> None:
        self._held: dict[str, V] = {}
        self._seen: set[str] = set()

    def _look(self, key: str) -> V | None:
        self._seen.add(key)
        return self._held.get(key)

    def forget_unseen(self) -> None:
        """Drop what the snapshot just taken did not look up."""
        for key in self._held.keys() - self._seen:
            del self._held[key]
        self._seen = set()


class NodeReads(Kept[tuple[Obj, Node, list[convert.Problem]]]):
    """Nodes (`convert.node_from`); the problems a read reported (a bad GPU-memory label) are
    reported again each snapshot. On 1,000 nodes reading them all was half of a snapshot."""

    def read(self, obj: Obj, problems: list[convert.Problem]) -> Node:
        key = object_key(obj)
        held = self._look(key)
        if held is None or held[0] is not obj:
            found: list[convert.Problem] = []
            node = convert.node_from(obj, found)  # raises on a bad node: nothing kept
            held = self._held[key] = (obj, node, found)
        problems.extend(held[2])
        return held[1]


class JobReads(Kept[tuple[Obj, tuple[Obj, ...], tuple[Any, ...], Job]]):
    """Jobs (`convert.job_from`): a PodGroup the watch has not replaced, with the very same
    member pods (in order) and the same priority classes, gives the job read last time. Only
    a job read whole is kept (one with a member left out is read again, and its problems said
    again)."""

    def get(self, key: str, pg: Obj, members: list[Obj], classes: tuple[Any, ...]
            ) -> Job | None:
        held = self._look(key)
        if held is None or held[0] is not pg or held[2] != classes \
                or len(held[1]) != len(members) \
                or any(a is not b for a, b in zip(held[1], members, strict=True)):
            return None
        return held[3]

    def keep(self, key: str, pg: Obj, members: list[Obj], classes: tuple[Any, ...],
             job: Job) -> None:
        self._held[key] = (pg, tuple(members), classes, job)


class PodReads(Kept[tuple[Obj, "dict[str, Any] | None", Pod]]):
    """Pods (`convert.pod_from`): a pod the watch has not replaced, with the same bind-intent
    entry, is not read again."""

    def read(self, pod: Obj, intent: Mapping[str, Any] | None) -> Pod:
        key = object_key(pod)
        held = self._look(key)
        if held is not None and held[0] is pod and held[1] == intent:
            return held[2]
        made = convert.pod_from(pod, intent)  # raises on a bad pod: nothing kept
        self._held[key] = (pod, copy.deepcopy(dict(intent)) if intent is not None else None,
                           made)
        return made

    def seen(self, pods: Iterable[Obj]) -> None:
        """Keep these pods' reads although this snapshot did not need them (their job was
        kept whole by JobReads)."""
        self._seen.update(object_key(p) for p in pods)
