"""The pod grouper: every pod with `schedulerName: kai-scheduler` gets its PodGroup (created or
updated as KAI does) and the `pod-group-name` annotation. The rules are the pure ones in
kai_ray.grouping; this module only reads owners and writes objects."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from kai_ray.controller.raywatch import RayClusterWatch
from kai_ray.grouping import GroupingConfig
from kai_ray.grouping.objects import GroupingError, RayClusterPending
from kai_ray.grouping.owners import resolve_top_owner
from kai_ray.grouping.podgroup import group_pod, should_group
from kai_ray.grouping.update import podgroup_update
from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import PG_GROUP, PG_PLURAL, PG_VERSION, ClusterCache
from kai_ray.k8s.events import EventRecorder

log = logging.getLogger(__name__)
Obj = dict[str, Any]
RESYNC_SECONDS = 10.0


class PassWrites:
    """The PodGroup writes of one grouping pass, by namespace/name. Pods of one gang usually
    arrive together (a RayCluster's or ReplicaSet's pods are created at once): the first pod to
    reach its PodGroup writes it, the others wait for that write and share its outcome, instead
    of each sending a create that all but one see refused (409) and then a read and a replace."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes: dict[str, Future[None]] = {}

    def once(self, key: str, write: Callable[[], None]) -> bool:
        """Run `write` unless another pod of this pass did (or does) for `key`; then wait for
        it, raising what it raised. True when this call wrote. No deadlock: a key's future
        exists only once its writer runs."""
        with self._lock:
            done = self._writes.get(key)
            if done is None:
                done = self._writes[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            done.result()
            return False
        try:
            write()
        except BaseException as e:
            done.set_exception(e)
            raise
        done.set_result(None)
        return True


class PodGrouper:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, events: EventRecorder,
                 config: GroupingConfig | None = None, workers: int = 8) -> None:
        self.api = api
        self.cache = cache
        self.events = events
        self.config = config or GroupingConfig()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._dynamic: dynamic.DynamicClient | None = None
        self._namespaces: dict[str, tuple[float, Mapping[str, str]]] = {}
        self._last_resync = 0.0
        self.retry: set[str] = set()
        self._retry_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grouper")
        self.ray_watch: RayClusterWatch | None = None

    # ------------------------------------------------------------------ reads
    def get_owner(self, api_version: str, kind: str, namespace: str, name: str
                  ) -> Mapping[str, Any] | None:
        with self._retry_lock:  # discovery once, not once per thread
            if self._dynamic is None:
                self._dynamic = dynamic.DynamicClient(self.api)
        try:
            resource = self._dynamic.resources.get(api_version=api_version, kind=kind)
            obj = resource.get(name=name, namespace=namespace if resource.namespaced else None)
        except ApiException as e:
            if e.status == 403:
                return None
            raise
        result: Mapping[str, Any] = obj.to_dict()
        return result

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        cached = self._namespaces.get(namespace)
        if cached and time.monotonic() - cached[0] < 30:
            return cached[1]
        try:
            ns = self.core.read_namespace(namespace)
            labels: Mapping[str, str] = ns.metadata.labels or {}
        except ApiException:
            labels = {}
        self._namespaces[namespace] = (time.monotonic(), labels)
        return labels

    # ------------------------------------------------------------------ reconcile
    def run_once(self) -> int:
        """Group the pods that changed (and, every few seconds, one pod per PodGroup, so owner
        changes such as a RayCluster's minReplicas reach the PodGroup). Returns pods handled."""
        dirty = set(self.cache.take_dirty_pods())
        with self._retry_lock:
            keys = dirty | self.retry | self._ray_changed()
            self.retry = set()
        now = time.monotonic()
        if now - self._last_resync > RESYNC_SECONDS:
            self._last_resync = now
            seen: set[tuple[str, str]] = set()
            for pod in self.cache.pods.values():
                m = pod.get("metadata") or {}
                group = (m.get("annotations") or {}).get("pod-group-name")
                if group and (m.get("namespace"), group) not in seen:
                    seen.add((m.get("namespace"), group))
                    keys.add(f"{m.get('namespace')}/{m['name']}")
        existing = {(pg["metadata"].get("namespace"), pg["metadata"]["name"])
                    for pg in self.cache.podgroups.values()}
        todo = []
        for key in sorted(keys):
            pod = self.cache.pods.get(key)
            if pod is None or not should_group(pod, self.config):
                continue
            m = pod["metadata"]
            group = (m.get("annotations") or {}).get("pod-group-name")
            if group and (m.get("namespace"), group) in existing and key in dirty \
                    and key not in keys - dirty:
                continue  # a status update of an already grouped pod
            todo.append((key, pod))
        # pods are independent but for their PodGroup, which one pod per gang writes
        writes = PassWrites()
        return sum(self.pool.map(lambda item: self._group_one(*item, writes), todo))

    def _group_one(self, key: str, pod: Obj, writes: PassWrites) -> int:
        try:
            self._group(pod, writes)
            return 1
        except RayClusterPending as e:
            log.info("%s", e)
        except GroupingError as e:
            self.events.emit(pod, "PodGrouperWarning", str(e), type_="Warning")
            return 0
        except ApiException as e:
            log.warning("grouping %s failed: %s %s", key, e.status, e.reason)
        with self._retry_lock:
            self.retry.add(key)
        return 0

    def _ray_changed(self) -> set[str]:
        """One pod of each RayCluster whose spec changed since the last cycle."""
        if self.ray_watch is None:
            self.ray_watch = RayClusterWatch(self.api).start()
        changed = self.ray_watch.take()
        if not changed:
            return set()
        out: dict[tuple[str, str], str] = {}
        for pod in self.cache.pods.values():
            m = pod.get("metadata") or {}
            cluster = (m.get("namespace", ""), (m.get("labels") or {}).get("ray.io/cluster", ""))
            if cluster in changed and cluster not in out:
                out[cluster] = f"{m.get('namespace')}/{m['name']}"
        return set(out.values())

    def _group(self, pod: Obj, writes: PassWrites) -> None:
        owners = resolve_top_owner(pod, self.get_owner)
        classes = {pc["metadata"]["name"] for pc in self.cache.priority_classes.values()}
        ns = pod["metadata"]["namespace"]
        grouping = group_pod(pod, owners, classes, self.config, self.namespace_labels(ns))
        for warning in grouping.warnings:
            self.events.emit(pod, "PodGrouperWarning", warning, type_="Warning")
        name = grouping.name
        writes.once(f"{ns}/{name}", lambda: self._write_podgroup(ns, name, grouping.podgroup))
        patch = grouping.pod_patch()
        m = pod["metadata"]
        have_ann = (m.get("annotations") or {}).get("pod-group-name")
        have_sub = (m.get("labels") or {}).get("kai.scheduler/subgroup-name")
        if have_ann != name or (grouping.subgroup is not None and have_sub != grouping.subgroup):
            rawapi.patch_pod(self.api, ns, m["name"], patch)

    def _write_podgroup(self, ns: str, name: str, desired: Obj) -> None:
        current = self.cache.podgroups.get(f"{ns}/{name}")
        if current is None:
            # create first: for a new owner (the common case) that is one request, not a GET
            # and a create; 409 means it exists after all (the cache lags): read and update it
            try:
                rawapi.create_custom(self.api, PG_GROUP, PG_VERSION, ns, PG_PLURAL, desired)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = self.custom.get_namespaced_custom_object(
                    PG_GROUP, PG_VERSION, ns, PG_PLURAL, name)
        if current is not None:
            updated = podgroup_update(current, desired, self.config)
            if updated is not None:
                self.custom.replace_namespaced_custom_object(PG_GROUP, PG_VERSION, ns,
                                                             PG_PLURAL, name, updated)
