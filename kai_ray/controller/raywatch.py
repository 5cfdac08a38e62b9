"""Which RayClusters changed their spec, from a watch: the pod grouper regroups one of their
pods at once, so a new minReplicas (or a suspended worker group) reaches the PodGroup within a
cycle instead of at the next resync. Without KubeRay's CRD (404), or without RBAC to list and
watch RayClusters (403), it tries again every 30 s, or at once when the pod grouper reads a
RayCluster (`served()`: KubeRay was installed after the scheduler); each change of that state is
logged once and `state()` says it for /healthz and /readyz.

The watch is the scheduler's own informer (kai_ray/k8s/cache.py), each RayCluster trimmed to
the metadata that tells a spec change: its generation."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import Informer

Key = tuple[str, str]  # (namespace, name)
RESOURCE = "rayclusters.ray.io"
PATH = "/apis/ray.io/v1/rayclusters"
# neither a missing CRD nor missing RBAC goes away within seconds
REFUSED_RETRY_S = 30.0


def _generation_only(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata") or {}
    return {"metadata": {k: m.get(k) for k in ("namespace", "name", "resourceVersion",
                                                "generation")}}


class RayClusterWatch:
    def __init__(self, api: client.ApiClient, watch_timeout: int = 60) -> None:
        self.changed: set[Key] = set()
        self.informer = Informer("rayclusters", rawapi.lister(api, PATH), self._seen,
                                 watch_timeout=watch_timeout, transform=_generation_only,
                                 refused_retry_s=REFUSED_RETRY_S)

    def start(self) -> RayClusterWatch:
        self.informer.start()
        return self

    def stop(self) -> None:
        self.informer.stop()

    def served(self) -> None:
        """A RayCluster was just read: if the watch waits out a refusal (no CRD yet), it looks
        again now, not up to 30 s later while minReplicas changes wait for the grouper's
        resync."""
        self.informer.wake()

    def take(self) -> set[Key]:
        with self.informer.lock:
            out, self.changed = self.changed, set()
        return out

    @property
    def problem(self) -> str | None:
        """None while the watch works (or has not answered yet); else why it does not."""
        refused = self.informer.refused
        if refused is None:
            return None
        if refused.status == 403:
            return (f"refused ({refused.status} {refused.reason}): the scheduler's RBAC lacks "
                    "list/watch; minReplicas changes are not followed at once, only at the pod "
                    "grouper's periodic resync")
        return (f"not served ({refused.status}): is KubeRay installed? Looking again every "
                f"{REFUSED_RETRY_S:.0f}s")

    def state(self) -> dict[str, object]:
        """For the health endpoints: informational, never a failure (the pod grouper still
        regroups every RayCluster's pods at its resync, only later)."""
        problem = self.problem
        out: dict[str, object] = {"ok": True, "watching": problem is None}
        if problem is not None:
            out["detail"] = problem
        return out

    def _seen(self, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """A RayCluster the cache held before whose generation moved: its spec changed (a relist
        after a broken watch tells a change made meanwhile the same way)."""
        if event == "DELETED" or old is None:
            return
        if obj["metadata"].get("generation") != old["metadata"].get("generation"):
            m = obj["metadata"]
            with self.informer.lock:
                self.changed.add((m.get("namespace") or "", m.get("name") or ""))
