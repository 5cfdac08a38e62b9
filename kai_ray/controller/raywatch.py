"""Which RayClusters changed their spec, from a watch: the pod grouper regroups one of their
pods at once, so a new minReplicas (or a suspended worker group) reaches the PodGroup within a
cycle instead of at the next resync. Without KubeRay's CRD it retries quietly every 30 s."""

from __future__ import annotations

import logging
import threading

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class RayClusterWatch:
    def __init__(self, api: client.ApiClient, watch_timeout: int = 60) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.watch_timeout = watch_timeout
        self.generations: dict[Key, int] = {}
        self.changed: set[Key] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="raycluster-watch", daemon=True)

    def start(self) -> RayClusterWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def take(self) -> set[Key]:
        with self.lock:
            out, self.changed = self.changed, set()
        return out

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
            if event == "MODIFIED" and self.generations.get(key) != generation:
                self.changed.add(key)
            self.generations[key] = generation

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                listing = self._list()
                assert isinstance(listing, dict)
                for obj in listing.get("items") or []:
                    self._seen(obj, "ADDED")
                rv = (listing.get("metadata") or {}).get("resourceVersion")
                for event in watch.Watch().stream(self._list, resource_version=rv,
                                                  timeout_seconds=self.watch_timeout,
                                                  _request_timeout=(5, self.watch_timeout + 15)):
                    if self.stopping.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._seen(event["object"], event["type"])
            except ApiException as e:
                # 404: KubeRay's CRDs are not installed (yet)
                self.stopping.wait(30.0 if e.status == 404 else 1.0)
            except Exception as e:  # the API server restarting, a broken stream
                log.debug("RayCluster watch: %s; restarting", e)
                self.stopping.wait(1.0)
