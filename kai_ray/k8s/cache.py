"""A watch cache of the objects the scheduler reads: list once, then follow the watch stream
(re-listing only when the server says the resourceVersion is too old). No full re-list per cycle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kai_ray.core.model import Node, Snapshot
from kai_ray.k8s import convert

log = logging.getLogger(__name__)
Obj = dict[str, Any]
ListFn = Callable[..., Any]

PG_GROUP, PG_VERSION, PG_PLURAL = "scheduling.run.ai", "v2alpha2", "podgroups"
Q_GROUP, Q_VERSION, Q_PLURAL = "scheduling.run.ai", "v2", "queues"


def _key(obj: Obj) -> str:
    m = obj.get("metadata") or {}
    ns = m.get("namespace")
    return f"{ns}/{m['name']}" if ns else m["name"]


OnChange = Callable[[str, Obj, "Obj | None"], None]  # (event, object, the one it replaced)


class Informer:
    """One kind of object, kept current in `items` by a background thread. `on_change` hears
    each event with the object the cache held before (None: it had none), so a hook can tell
    what changed."""

    def __init__(self, name: str, list_fn: ListFn, on_change: OnChange,
                 watch_timeout: int = 300) -> None:
        self.name = name
        self.list_fn = list_fn
        self.on_change = on_change
        self.items: dict[str, Obj] = {}
        self.lock = threading.RLock()
        self.synced = threading.Event()
        self.stopping = threading.Event()
        self.watch_timeout = watch_timeout
        self.thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """The stream ends at its next event or timeout (the thread is a daemon). Closing the
        response from here would block on the lock its reading thread holds."""
        self.stopping.set()

    def values(self) -> list[Obj]:
        with self.lock:
            return list(self.items.values())

    def get(self, key: str) -> Obj | None:
        with self.lock:
            return self.items.get(key)

    def _list(self) -> str:
        resp = self.list_fn(_preload_content=False)
        body = json.loads(resp.data)
        fresh = {_key(o): o for o in body.get("items") or []}
        with self.lock:
            before, self.items = self.items, fresh
        for key in set(before) - set(fresh):
            self.on_change("DELETED", before[key], before[key])
        for key, obj in fresh.items():
            self.on_change("ADDED", obj, before.get(key))
        self.synced.set()
        rv: str = (body.get("metadata") or {}).get("resourceVersion", "")
        return rv

    def _stream(self, rv: str) -> Iterator[Obj]:
        """The watch's events as plain dicts. Not `kubernetes.watch.Watch`: it would turn every
        object into the generated models first, the most CPU the scheduler spends on a busy
        cluster, for objects we only read as JSON."""
        resp = self.list_fn(watch=True, resource_version=rv, timeout_seconds=self.watch_timeout,
                            allow_watch_bookmarks=True, _preload_content=False)
        try:
            for line in iter_resp_lines(resp):
                if self.stopping.is_set():
                    return
                if line:
                    yield json.loads(line)
        finally:
            resp.release_conn()

    def _run(self) -> None:
        rv = ""
        backoff = 0.5
        while not self.stopping.is_set():
            try:
                if not rv:
                    rv = self._list()
                for event in self._stream(rv):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            rv = ""
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    key = _key(obj)
                    with self.lock:
                        if kind == "DELETED":
                            old = self.items.pop(key, None)
                        else:
                            old = self.items.get(key)
                            self.items[key] = obj
                    self.on_change(kind, obj, old)
                backoff = 0.5
            except ApiException as e:
                if e.status == 410:
                    rv = ""
                    continue
                if self.stopping.is_set():
                    return
                log.warning("watch %s failed (%s); retrying in %.1fs", self.name, e.status, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:  # connection drops: keep the cache alive, re-list
                if self.stopping.is_set():
                    return
                log.exception("watch %s broke; re-listing", self.name)
                rv = ""
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)


class ClusterCache:
    """Nodes, pods, PodGroups, Queues and PriorityClasses, and the snapshot built from them."""

    def __init__(self, api: client.ApiClient) -> None:
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        sched = client.SchedulingV1Api(api)
        self.changed = threading.Event()
        # pods whose PodGroup membership must be (re)computed by the pod grouper, and the
        # grouper's wake-up: set (and counted) only for pod events that can change grouping
        self.dirty_pods: set[str] = set()
        self.pods_to_group = threading.Event()
        self.grouping_wakeups = 0
        self._dirty_lock = threading.Lock()
        self.nodes = Informer("nodes", core.list_node, self._touch)
        self.pods = Informer("pods", core.list_pod_for_all_namespaces, self._pod_changed)
        self.podgroups = Informer(
            "podgroups", lambda **kw: custom.list_cluster_custom_object(
                PG_GROUP, PG_VERSION, PG_PLURAL, **kw), self._touch)
        self.queues = Informer(
            "queues", lambda **kw: custom.list_cluster_custom_object(
                Q_GROUP, Q_VERSION, Q_PLURAL, **kw), self._touch)
        self.priority_classes = Informer("priorityclasses", sched.list_priority_class, self._touch)
        self.informers = [self.nodes, self.pods, self.podgroups, self.queues,
                          self.priority_classes]

    def _touch(self, kind: str, obj: Obj, old: Obj | None) -> None:
        self.changed.set()

    def _pod_changed(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind != "DELETED" and convert.is_ours(obj) and may_regroup(obj, old):
            with self._dirty_lock:
                self.dirty_pods.add(_key(obj))
                self.grouping_wakeups += 1
                self.pods_to_group.set()
        self.changed.set()

    def take_dirty_pods(self) -> list[str]:
        with self._dirty_lock:
            keys, self.dirty_pods = sorted(self.dirty_pods), set()
            self.pods_to_group.clear()
        return keys

    def check_crds(self) -> None:
        """Fail with instructions when KAI's CRDs are missing, instead of waiting forever."""
        for inf, crd in ((self.podgroups, "podgroups.scheduling.run.ai"),
                         (self.queues, "queues.scheduling.run.ai")):
            try:
                inf.list_fn(limit=1, _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    raise RuntimeError(
                        f"the {crd} CRD is not installed in this cluster; install kai-ray's "
                        "CRDs first (helm install, or kubectl apply -f kai_ray/k8s/crds/)") from e
                raise

    def start(self, timeout: float = 60.0) -> None:
        self.check_crds()
        for inf in self.informers:
            inf.start()
        deadline = time.monotonic() + timeout
        for inf in self.informers:
            if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"cache: {inf.name} did not sync within {timeout:.0f}s")

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()

    # -------------------------------------------------------------------------------- snapshot
    def priority_classes_map(self) -> tuple[dict[str, int], int | None]:
        classes: dict[str, int] = {}
        default = None
        for pc in self.priority_classes.values():
            name = pc["metadata"]["name"]
            classes[name] = int(pc.get("value", 0))
            if pc.get("globalDefault"):
                default = classes[name]
        return classes, default

    def snapshot(self) -> tuple[Snapshot, list[convert.Problem], dict[str, Obj]]:
        """(snapshot, problems found while reading it, PodGroups by job name)."""
        problems: list[convert.Problem] = []
        pods = self.pods.values()
        by_group: dict[tuple[str, str], list[Obj]] = {}
        foreign: dict[str, list[int]] = {}
        for pod in pods:
            m = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            if convert.is_ours(pod):
                group = (m.get("annotations") or {}).get(convert.POD_GROUP_ANNOTATION)
                if group:
                    by_group.setdefault((m.get("namespace", ""), group), []).append(pod)
                continue
            node = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if not node or phase in ("Succeeded", "Failed"):
                continue
            if m.get("namespace") == convert.RESERVATION_NAMESPACE \
                    and not m.get("deletionTimestamp"):
                continue  # its device is counted as the shared device it reserves
            # a terminating one (rolled back, or its last sharer gone) holds its GPU until the
            # kubelet lets go: counted as foreign use, no group stands for it any more
            req = convert.pod_request(pod)
            usage = foreign.setdefault(node, [0, 0, 0, 0])
            usage[0] += req.cpu_m
            usage[1] += req.memory
            usage[2] += req.gpus
            usage[3] += 1
        nodes: list[Node] = []
        for obj in self.nodes.values():
            try:
                node = convert.node_from(obj)
            except (ValueError, KeyError) as e:
                problems.append(convert.Problem("Node", None, obj["metadata"]["name"],
                                                "status.allocatable", str(e)))
                continue
            used = foreign.get(node.name)
            if used:
                node = Node(**{**_fields(node), "foreign_cpu_m": used[0],
                               "foreign_memory": used[1], "foreign_gpus": used[2],
                               "foreign_pods": used[3]})
            nodes.append(node)
        queues = []
        for obj in self.queues.values():
            q = convert.queue_from(obj)
            if isinstance(q, convert.Problem):
                problems.append(q)
            else:
                queues.append(q)
        from kai_ray.k8s.suspend import stand_in_pods  # suspend needs this module's names

        classes, default = self.priority_classes_map()
        jobs = []
        podgroups: dict[str, Obj] = {}
        for pg in self.podgroups.values():
            m = pg["metadata"]
            # a gang suspended by preemption (a RayJob) keeps its demand as stand-in pods
            members = by_group.get((m.get("namespace", ""), m["name"])) or stand_in_pods(pg)
            try:
                jobs.append(convert.job_from(pg, members, classes, default))
                podgroups[m["name"]] = pg
            except (ValueError, KeyError, TypeError) as e:
                problems.append(convert.Problem("PodGroup", m.get("namespace"), m["name"],
                                                "spec", str(e)))
        return Snapshot(tuple(nodes), tuple(queues), tuple(jobs),
                        tuple(classes.items())), problems, podgroups


# what the pod grouper reads from a pod: its owners, and labels and annotations (queue,
# priority, preemptibility, subgroup, pod-group-name). The rest changes with binds and status
# (nodeName, conditions, phase), which no grouping depends on.
GROUPING_FIELDS = ("ownerReferences", "labels", "annotations")


def may_regroup(pod: Obj, old: Obj | None) -> bool:
    """Whether `pod` (replacing `old` in the cache) may need grouping: a pod new to the cache,
    or one whose owners, labels or annotations changed. A deleted pod needs none: the grouper
    skips pods the cache no longer holds."""
    if old is None:
        return True
    m, o = pod.get("metadata") or {}, old.get("metadata") or {}
    return any(m.get(f) != o.get(f) for f in GROUPING_FIELDS)


def _fields(node: Node) -> dict[str, Any]:
    return {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}


def objects(items: Iterable[Obj]) -> dict[str, Obj]:
    return {_key(o): o for o in items}
