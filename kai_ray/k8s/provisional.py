"""PodGroups of bare pods that are not written yet.

A pod with no owner gets a PodGroup of one (KAI's rule). Writing it and annotating the pod
before the pod may be scheduled costs two round trips on the pod's way to its node, and the
PodGroup's last-start stamp a third after the bind. Instead the pod grouper registers the
PodGroup it would write here; the snapshot schedules the pod with it as if it existed; the
binder binds the pod with the `pod-group-name` annotation on the Binding (the API server copies
a Binding's annotations onto the pod) and has the PodGroup created afterwards, stamped with the
start. A pod that cannot be placed gets its PodGroup written as before (the loop asks for it),
so `kubectl get podgroups` shows why it waits; a pod that runs always has its PodGroup.

States of an entry (job key `namespace/name`):
- `waiting`: nothing written yet; the next cycle may bind the pod.
- `bound`: the binder bound the pod; its PodGroup is being created (the grouper leaves it be).
- `write`: the grouper writes the PodGroup and the annotation as for any pod (the pod waits,
  or the create after its bind failed).
An entry goes once the watch shows the written PodGroup, or its pod is gone.
"""

from __future__ import annotations

import threading
from typing import Any

Obj = dict[str, Any]
#: the key a provisional PodGroup carries in the snapshot's PodGroup dicts (never sent)
PROVISIONAL = "_kai_ray_provisional"
WAITING, BOUND, WRITE = "waiting", "bound", "write"


def is_provisional(pg: Obj | None) -> bool:
    return bool(pg and pg.get(PROVISIONAL))


def written_form(pg: Obj) -> Obj:
    """The PodGroup as it is sent: without the in-memory marker."""
    return {k: v for k, v in pg.items() if k != PROVISIONAL}


class ProvisionalGroups:
    """Shared by the grouper's thread, the loop's and the binder's: every access locks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, Obj] = {}  # job key -> the PodGroup the grouper would write
        self._state: dict[str, str] = {}  # job key -> state
        self._pods: dict[str, str] = {}  # pod key -> job key
        self._job_pod: dict[str, str] = {}  # job key -> pod key

    def __len__(self) -> int:
        with self._lock:
            return len(self._groups)

    def add(self, pod_key: str, job_key: str, podgroup: Obj) -> bool:
        """Register the PodGroup of a bare pod; False when the entry exists in another state
        than `waiting` (the binder has it, or it is to be written)."""
        with self._lock:
            state = self._state.get(job_key)
            if state not in (None, WAITING):
                return False
            self._groups[job_key] = {**podgroup, PROVISIONAL: True}
            self._state[job_key] = WAITING
            self._pods[pod_key] = job_key
            self._job_pod[job_key] = pod_key
            return True

    def state(self, job_key: str) -> str | None:
        with self._lock:
            return self._state.get(job_key)

    def group_of(self, pod_key: str) -> str | None:
        """The job key of a pod's provisional PodGroup (None: it has none)."""
        with self._lock:
            return self._pods.get(pod_key)

    def view(self) -> tuple[dict[str, Obj], dict[str, str]]:
        """(job key -> provisional PodGroup, of the entries not being written; pod key -> job
        key), copied at once for a snapshot."""
        with self._lock:
            groups = {k: v for k, v in self._groups.items() if self._state[k] != WRITE}
            return groups, {p: j for p, j in self._pods.items() if j in groups}

    def mark(self, job_key: str, state: str) -> str | None:
        """Move an entry to `state`; returns its pod key (None: no such entry)."""
        with self._lock:
            if job_key not in self._groups:
                return None
            self._state[job_key] = state
            return self._job_pod[job_key]

    def claim_for_bind(self, job_key: str) -> bool:
        """The binder takes a `waiting` entry to bind its pod; False when the grouper is
        writing it meanwhile (the binder then binds as for any PodGroup)."""
        with self._lock:
            if self._state.get(job_key) != WAITING:
                return False
            self._state[job_key] = BOUND
            return True

    def prune(self, live_pods: set[str], written: set[str]) -> None:
        """Forget entries whose PodGroup the watch shows (`written`: job keys) or whose pod
        is gone (`live_pods`: pod keys)."""
        with self._lock:
            for job_key, pod_key in list(self._job_pod.items()):
                if job_key in written or pod_key not in live_pods:
                    del self._groups[job_key], self._state[job_key], self._job_pod[job_key]
                    self._pods.pop(pod_key, None)
