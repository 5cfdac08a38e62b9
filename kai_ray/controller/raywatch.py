"""Which RayClusters changed their spec, from a watch: the pod grouper regroups one of their
pods at once, so a new minReplicas (or a suspended worker group) reaches the PodGroup within a
cycle instead of at the next resync. Without KubeRay's CRD (404), or without RBAC to list and
watch RayClusters (403), it tries again every 30 s, or at once when the pod grouper reads a
RayCluster (`served()`: KubeRay was installed after the scheduler); each change of that state is
logged once and `state()` says it for /healthz and /readyz."""

from __future__ import annotations

import logging
import threading

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
RESOURCE = "rayclusters.ray.io"
# neither a missing CRD nor missing RBAC goes away within seconds; other faults may
REFUSED_RETRY_S, FAULT_RETRY_S = 30.0, 1.0


class RayClusterWatch:
    def __init__(self, api: client.ApiClient, watch_timeout: int = 60) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.watch_timeout = watch_timeout
        self.generations: dict[Key, int] = {}
        self.changed: set[Key] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._wake = threading.Event()  # a stop, or proof that the CRD is served now
        self._crd_missing = False  # the last list was answered 404
        self.thread = threading.Thread(target=self._run, name="raycluster-watch", daemon=True)
        # None while the watch works (or has not answered yet); else why it does not
        self.problem: str | None = None

    def start(self) -> RayClusterWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def served(self) -> None:
        """A RayCluster was just read: if the watch waits out a 404 (no CRD), it looks again
        now, not up to 30 s later while minReplicas changes wait for the grouper's resync."""
        if self._crd_missing:
            self._wake.set()

    def _pause(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def take(self) -> set[Key]:
        with self.lock:
            out, self.changed = self.changed, set()
        return out

    def state(self) -> dict[str, object]:
        """For the health endpoints: informational, never a failure (the pod grouper still
        regroups every RayCluster's pods at its resync, only later)."""
        out: dict[str, object] = {"ok": True, "watching": self.problem is None}
        if self.problem is not None:
            out["detail"] = self.problem
        return out

    def _set_problem(self, problem: str | None, level: int = logging.WARNING) -> None:
        """Log the watch's state when it changes, not at every retry."""
        if problem == self.problem:
            return
        if problem is not None:
            log.log(level, "watch of %s %s", RESOURCE, problem)
        else:
            log.info("watch of %s works again: minReplicas changes are followed at once",
                     RESOURCE)
        self.problem = problem

    def _list(self, **kwargs: object) -> object:
        return self.custom.list_cluster_custom_object("ray.io", "v1", "rayclusters", **kwargs)

    def _seen(self, obj: dict, event: str) -> None:
        m = obj.get("metadata") or {}
        key = (m.get("namespace", ""), m.get("name", ""))
        generation = int(m.get("generation") or 0)
        with self.lock:
            if event == "DELETED":
                self.generations.pop(key, None)
                return
            # a relist (after a broken or expired watch) also tells a change made meanwhile
            known = self.generations.get(key)
            if (event == "MODIFIED" or (event == "LISTED" and known is not None)) \
                    and known != generation:
                self.changed.add(key)
            self.generations[key] = generation

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                listing = self._list()
                assert isinstance(listing, dict)
                self._set_problem(None)
                self._crd_missing = False
                for obj in listing.get("items") or []:
                    self._seen(obj, "LISTED")
                rv = (listing.get("metadata") or {}).get("resourceVersion")
                for event in watch.Watch().stream(self._list, resource_version=rv,
                                                  timeout_seconds=self.watch_timeout,
                                                  _request_timeout=(5, self.watch_timeout + 15)):
                    if self.stopping.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._seen(event["object"], event["type"])
            except ApiException as e:
                self._crd_missing = e.status == 404
                if e.status == 403:
                    self._set_problem(
                        f"refused ({e.status} {e.reason}): the scheduler's RBAC lacks "
                        "list/watch; minReplicas changes are not followed at once, only at "
                        "the pod grouper's periodic resync")
                elif e.status == 404:  # KubeRay's CRDs are not installed (yet)
                    self._set_problem("not served (404): is KubeRay installed? Looking again "
                                      f"every {REFUSED_RETRY_S:.0f}s", logging.INFO)
                else:
                    log.debug("RayCluster watch: %s %s; restarting", e.status, e.reason)
                self._pause(REFUSED_RETRY_S if e.status in (403, 404) else FAULT_RETRY_S)
            except Exception as e:  # the API server restarting, a broken stream
                log.debug("RayCluster watch: %s; restarting", e)
                self._pause(FAULT_RETRY_S)
