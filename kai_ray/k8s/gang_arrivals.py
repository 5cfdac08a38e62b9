"""When a gang is whole: the pods that name each PodGroup (their `pod-group-name` annotation),
counted as the pod watch sees them, against the PodGroup's minMember.

A gang's pods arrive one by one (KubeRay, or a client creating a PodGroup and its pods). The
scheduling loop used to pause a fixed 0.1 s after the first arrival so the rest could come;
most gangs were whole sooner, and a slower one was read half and waited a cycle more. With
this, the loop starts a cycle as soon as some gang has its minimum (`whole` is set), and keeps
the pause only for arrivals that complete no gang (a bare pod, an elastic pod, a gang still
short).
"""
from __future__ import annotations

import threading
from typing import Any

from kai_ray.api_names import POD_GROUP_ANNOTATION

Obj = dict[str, Any]


def _group_key(pod: Obj | None) -> str | None:
    if pod is None:
        return None
    m = pod.get("metadata") or {}
    group = (m.get("annotations") or {}).get(POD_GROUP_ANNOTATION)
    return f"{m.get('namespace')}/{group}" if group else None


def min_member(podgroup: Obj) -> int | None:
    """The PodGroup's minMember, or None when it is not a usable one (the cycle reports a bad
    value on the PodGroup; here it only means: no early start for this gang)."""
    value = (podgroup.get("spec") or {}).get("minMember", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


class GangArrivals:
    """Pods per PodGroup, and `whole`: set when a pod's arrival (or its PodGroup's) leaves a
    gang with at least minMember pods. Fed by the cache's pod and PodGroup watch threads."""

    def __init__(self) -> None:
        self.whole = threading.Event()
        self._members: dict[str, set[str]] = {}
        self._unbound: dict[str, set[str]] = {}  # members with no node yet
        self._lock = threading.Lock()

    def pod_event(self, kind: str, key: str, pod: Obj, old: Obj | None) -> str | None:
        """Track the pod's membership; the PodGroup it joined with this event, if any."""
        group, before = _group_key(pod), _group_key(old)
        with self._lock:
            if before is not None and (kind == "DELETED" or before != group):
                for index in (self._members, self._unbound):
                    _discard(index, before, key)
            if kind == "DELETED" or group is None:
                return None
            if (pod.get("spec") or {}).get("nodeName"):
                _discard(self._unbound, group, key)
            else:
                self._unbound.setdefault(group, set()).add(key)
            members = self._members.setdefault(group, set())
            if key in members:
                return None
            members.add(key)
            return group

    def count(self, group: str) -> int:
        with self._lock:
            return len(self._members.get(group, ()))

    def check(self, group: str, podgroup: Obj | None) -> bool:
        """Set `whole` if `group` has its minimum now (its PodGroup known) and a pod still to
        place (a PodGroup written after its pods were bound starts nothing); True if so."""
        need = None if podgroup is None else min_member(podgroup)
        with self._lock:
            waiting = bool(self._unbound.get(group))
        if need is None or not waiting or self.count(group) < need:
            return False
        self.whole.set()
        return True


def _discard(index: dict[str, set[str]], group: str, key: str) -> None:
    members = index.get(group)
    if members is not None:
        members.discard(key)
        if not members:
            del index[group]
