"""The pod grouper: every pod with `schedulerName: kai-scheduler` gets its PodGroup (created or
updated as KAI does) and the `pod-group-name` annotation. The rules are the pure ones in
kai_ray.grouping; this module only reads owners and writes objects.

No pod is dropped on an error: each pod's failure is caught on its own (the other pods of the
pass are grouped), and the pod is either retried with its own jittered exponential back-off
(1 s doubling to 60 s, as KAI's pod grouper requeues) or told why on a PodGrouperWarning event.
Transient failures (API 5xx/429/409, owner 404, connection errors) are told once they repeat;
anything else is told at once and still retried. An owner whose kind the API server does not
serve cannot ever be read: the walk stops there, as for a 403, and the pod is grouped by the
owners read so far (the pod itself if none), with an event naming the unreadable reference.
(KAI requeues such a pod for as long as it exists, so it never runs; grouping it by what could
be read lets it be scheduled, and the event says why its PodGroup is not its owner's.)"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kai_ray import api_names
from kai_ray.api_names import LAST_START_ANNOTATION, PODGROUP
from kai_ray.controller.raywatch import RayClusterWatch
from kai_ray.grouping import GroupingConfig
from kai_ray.grouping.admission import requests_gpu_sharing
from kai_ray.grouping.objects import GroupingError, RayClusterPending, ref
from kai_ray.grouping.owners import Owners, resolve_top_owner
from kai_ray.grouping.podgroup import Grouping, group_pod, should_group
from kai_ray.grouping.update import podgroup_update
from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.provisional import BOUND, WAITING, WRITE, ProvisionalGroups, written_form

log = logging.getLogger(__name__)
Obj = dict[str, Any]
RESYNC_SECONDS = 10.0
RETRY_BASE_S, RETRY_MAX_S = 1.0, 60.0
# transient failures in a row before the pod is told (the first few are usually a blip)
WARN_AFTER = 3
# how long a kind the API server does not serve is remembered: each miss costs the dynamic
# client a full rediscovery, which a pod regrouped every resync would otherwise repeat
UNSERVED_KIND_TTL_S = 30.0


class OwnerNotFound(Exception):
    """An ownerReference (or a RayJob's RayCluster) names an object that does not exist."""


def _transient(e: BaseException) -> bool:
    """Worth retrying quietly a few times: the API server or the network may recover."""
    if isinstance(e, OwnerNotFound):
        return True  # often a race with its creation or deletion; the GC removes orphans
    if isinstance(e, ApiException):
        return not e.status or e.status in (404, 409, 429) or e.status >= 500
    return isinstance(e, urllib3.exceptions.HTTPError | OSError)  # OSError: TimeoutError too


def _describe(e: BaseException) -> str:
    if isinstance(e, OwnerNotFound):
        return str(e)
    if isinstance(e, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):  # not a Status
            message = json.loads(e.body or "{}").get("message", "")
        return f"API error {e.status} {e.reason}" + (f": {message}" if message else "")
    return f"{type(e).__name__}: {e}"[:500]


def retry_delay(attempts: int) -> float:
    """Seconds before try `attempts + 1`: doubling from RETRY_BASE_S to RETRY_MAX_S, ±20 % so
    pods that failed together (one outage) do not all come back in the same pass."""
    delay = min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** min(max(attempts - 1, 0), 16))
    return delay * random.uniform(0.8, 1.2)


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
        self.custom = client.CustomObjectsApi(api)
        self._dynamic: dynamic.DynamicClient | None = None
        self._namespaces: dict[str, tuple[float, Mapping[str, str]]] = {}
        self._last_resync = 0.0
        # pods to group again: key -> (failures in a row, not before (monotonic))
        self.retry: dict[str, tuple[int, float]] = {}
        self._retry_lock = threading.Lock()
        self._discovery_lock = threading.Lock()
        self._unserved: dict[tuple[str, str], float] = {}  # (apiVersion, kind) -> until
        self._told: set[tuple[str, str]] = set()  # (pod uid, message) of one-off warnings
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grouper")
        self.ray_watch: RayClusterWatch | None = None
        # bare pods scheduled before their PodGroup is written (kai_ray.k8s.provisional): on
        # only beside a scheduling loop (SchedulerLoop.run), which asks for the PodGroups of
        # the pods it cannot place; a grouper on its own writes every PodGroup at once
        self.defer_bare_pods = False
        self._after_binds: list[Obj] = []  # PodGroups of bound bare pods, not yet sent
        self._after_binds_lock = threading.Lock()

    # ------------------------------------------------------------------ reads
    def get_owner(self, api_version: str, kind: str, namespace: str, name: str
                  ) -> Mapping[str, Any] | None:
        """The owner as a dict; None when it may not be read (403). Raises OwnerNotFound (404),
        ResourceNotFoundError when the API server serves no such kind, or what the request
        raised."""
        with self._discovery_lock:  # discovery once, not once per thread
            if self._dynamic is None:
                self._dynamic = dynamic.DynamicClient(self.api)
            until = self._unserved.get((api_version, kind), 0.0)
        if time.monotonic() < until:
            raise ResourceNotFoundError(f"No matches found for {kind} in {api_version}")
        try:
            resource = self._dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            with self._discovery_lock:
                self._unserved[(api_version, kind)] = time.monotonic() + UNSERVED_KIND_TTL_S
            raise
        try:
            obj = resource.get(name=name, namespace=namespace if resource.namespaced else None)
        except ApiException as e:
            if e.status == 403:
                return None
            if e.status == 404:
                where = f"{namespace}/{name}" if resource.namespaced else name
                raise OwnerNotFound(
                    f"{kind} {where} (apiVersion {api_version}) does not exist") from e
            raise
        result: Mapping[str, Any] = obj.to_dict()
        if kind == "RayCluster" and self.ray_watch is not None:
            self.ray_watch.served()  # KubeRay may have come after the scheduler started
        return result

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        cached = self._namespaces.get(namespace)
        if cached and time.monotonic() - cached[0] < 30:
            return cached[1]
        try:  # a plain GET: the grouper's first pass need not wait for CoreV1Api's import
            ns = rawapi.request_json(self.api, "GET", f"/api/v1/namespaces/{namespace}")
            labels: Mapping[str, str] = (ns.get("metadata") or {}).get("labels") or {}
        except ApiException:
            labels = {}
        self._namespaces[namespace] = (time.monotonic(), labels)
        return labels

    # ------------------------------------------------------------------ reconcile
    def run_once(self) -> int:
        """Group the pods that changed (and, every few seconds, one pod per PodGroup, so owner
        changes such as a RayCluster's minReplicas reach the PodGroup). Returns pods handled."""
        dirty = set(self.cache.take_dirty_pods())
        now = time.monotonic()
        with self._retry_lock:
            due = {key for key, (_, at) in self.retry.items() if at <= now}
        keys = dirty | due | self._ray_changed()
        if now - self._last_resync > RESYNC_SECONDS:
            self._last_resync = now
            seen: set[tuple[str, str]] = set()
            for pod in self.cache.pods.values():
                m = pod.get("metadata") or {}
                group = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
                if group and (m.get("namespace"), group) not in seen:
                    seen.add((m.get("namespace"), group))
                    keys.add(f"{m.get('namespace')}/{m['name']}")
        registry = self._registry()
        # looked up per pod, never built whole: a pass per pod event, thousands of PodGroups
        also_due = keys - dirty
        todo = []
        for key in sorted(keys):
            pod = self.cache.pods.get(key)
            if pod is None or not should_group(pod, self.config):
                self._forget(key)  # deleted, or no longer ours
                continue
            m = pod["metadata"]
            group = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
            if group and key in dirty and key not in also_due:
                job_key = f"{m.get('namespace')}/{group}"
                if self.cache.podgroups.get(job_key) is not None or (
                        registry is not None and registry.state(job_key) == BOUND):
                    continue  # a status update of an already grouped pod, or one just bound
            todo.append((key, pod))
        # pods are independent but for their PodGroup, which one pod per gang writes
        writes = PassWrites()
        # a bare pod whose PodGroup is only registered (no API call) is grouped here: the
        # pool's threads would only take turns on the GIL (5,000 such pods at start-up: 1.0 s
        # through the pool, a fraction of that here); the rest go to the pool
        bare, pooled = [], []
        for item in todo:
            (pooled if item[1]["metadata"].get("ownerReferences") else bare).append(item)
        # their namespaces' labels read first, on the pool (a GET each when not cached): a
        # namespace that cannot be read now sends its pods to the pool, as before
        spaces = sorted({pod["metadata"].get("namespace", "") for _, pod in bare})
        labels = dict(zip(spaces, self.pool.map(self._labels_or_none, spaces), strict=True))
        handled = 0
        for item in bare:
            done = self._group_one(*item, writes, inline_labels=labels)
            if done is None:
                pooled.append(item)
            else:
                handled += done
        handled += sum(n or 0 for n in self.pool.map(
            lambda item: self._group_one(*item, writes), pooled))
        arrivals = getattr(self.cache, "arrivals", None)
        if handled and arrivals is not None:
            arrivals.set()  # grouped pods may be placed now: the loop need not wait its period
        return handled

    def _labels_or_none(self, namespace: str) -> Mapping[str, str] | None:
        try:
            return self.namespace_labels(namespace)
        except Exception:  # a timeout, a reset: the pool's pass reads it again
            return None

    def _group_one(self, key: str, pod: Obj, writes: PassWrites,
                   inline_labels: Mapping[str, Mapping[str, str] | None] | None = None
                   ) -> int | None:
        """Group one pod; every failure stays with this pod (never the pass), and leaves it
        scheduled for a retry or told why. `inline_labels` (namespace labels read for this
        pass): only if its PodGroup can wait to be written (kai_ray.k8s.provisional), with no
        API call; None, with nothing done, where it cannot."""
        try:
            if not self._group(pod, writes, inline_labels):
                return None
        except RayClusterPending as e:
            # not a failure: the operator has not named the cluster yet; look again next pass
            log.info("%s", e)
            with self._retry_lock:
                self.retry[key] = (self.retry.get(key, (0, 0.0))[0], 0.0)
            return 0
        except GroupingError as e:  # the objects are wrong: told; a change regroups the pod
            self._forget(key)
            self.events.emit(pod, "PodGrouperWarning", str(e), type_="Warning")
            return 0
        except Exception as e:
            self._failed(key, pod, e)
            return 0
        self._forget(key)
        return 1

    def _forget(self, key: str) -> None:
        with self._retry_lock:
            self.retry.pop(key, None)

    def _failed(self, key: str, pod: Obj, e: Exception) -> None:
        with self._retry_lock:
            attempts = self.retry.get(key, (0, 0.0))[0] + 1
            delay = retry_delay(attempts)
            self.retry[key] = (attempts, time.monotonic() + delay)
        what = _describe(e)
        transient = _transient(e)
        log.warning("grouping %s failed (%d in a row; next try in %.1fs): %s", key, attempts,
                    delay, what, exc_info=None if transient or isinstance(e, ApiException)
                    else e)
        if not transient or attempts == WARN_AFTER:
            self.events.emit(pod, "PodGrouperWarning",
                             f"the pod cannot be grouped yet: {what}; the pod grouper retries "
                             "with back-off (up to a minute apart)", type_="Warning")

    def _tell_once(self, pod: Obj, message: str) -> None:
        """A Warning told once per pod and message: the recorder remembers only each pod's
        last message, and the grouping warnings of every resync would alternate with it."""
        told = ((pod.get("metadata") or {}).get("uid", ""), message)
        with self._retry_lock:
            if told in self._told:
                return
            if len(self._told) > 10_000:
                self._told.clear()
            self._told.add(told)
        self.events.emit(pod, "PodGrouperWarning", message, type_="Warning")

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

    def _group(self, pod: Obj, writes: PassWrites,
               inline_labels: Mapping[str, Mapping[str, str] | None] | None = None) -> bool:
        """Group `pod`: its PodGroup registered or written, the pod annotated. With
        `inline_labels` (its namespace's labels as read for this pass), only a pod whose
        PodGroup is registered, with no API call: False, with nothing done or told, for one
        that needs a read or a write."""
        unserved: list[str] = []

        def read(api_version: str, kind: str, namespace: str, name: str
                 ) -> Mapping[str, Any] | None:
            try:
                return self.get_owner(api_version, kind, namespace, name)
            except ResourceNotFoundError:
                # never readable, so retrying cannot help: stop the walk here, as for a 403
                unserved.append(f"{kind} {name} (apiVersion {api_version})")
                return None

        owners = resolve_top_owner(pod, read)
        classes = {pc["metadata"]["name"] for pc in self.cache.priority_classes.values()}
        ns = pod["metadata"]["namespace"]
        if inline_labels is None:
            ns_labels = self.namespace_labels(ns)
        else:
            known = inline_labels.get(ns)
            if known is None:
                return False  # its namespace could not be read: the pool reads it again
            ns_labels = known
        grouping = group_pod(pod, owners, classes, self.config, ns_labels)
        if inline_labels is not None and not (self._deferrable(pod, owners, grouping)
                                              and self._registrable(f"{ns}/{grouping.name}")):
            return False  # to the pool: its PodGroup is written (two round trips)
        for warning in grouping.warnings:
            self.events.emit(pod, "PodGrouperWarning", warning, type_="Warning")
        for owner in unserved:
            self._tell_once(pod, f"ownerReference {owner} cannot be read: the API server "
                                 f"serves no such kind; the pod is grouped by {ref(owners.top)}"
                                 " instead")
        name = grouping.name
        if self._defer(pod, owners, grouping):
            return True  # its PodGroup is written with or after its bind (k8s.provisional)
        writes.once(f"{ns}/{name}", lambda: self._write_podgroup(ns, name, grouping.podgroup))
        patch = grouping.pod_patch()
        m = pod["metadata"]
        have_ann = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
        have_sub = (m.get("labels") or {}).get(api_names.SUBGROUP_LABEL)
        if have_ann != name or (grouping.subgroup is not None and have_sub != grouping.subgroup):
            rawapi.patch_pod(self.api, ns, m["name"], patch)
        return True

    def _deferrable(self, pod: Obj, owners: Owners, grouping: Grouping) -> bool:
        """Whether a pod may be scheduled with its PodGroup unwritten: a bare, unbound pod,
        not one that shares a GPU (its bind needs a bind intent, which lives on the PodGroup),
        and whose PodGroup does not exist."""
        m = pod["metadata"]
        job_key = f"{m.get('namespace', '')}/{grouping.name}"
        return not (self._registry() is None or owners.chain
                    or owners.top.get("kind") != "Pod" or grouping.subgroup is not None
                    or (pod.get("spec") or {}).get("nodeName") or requests_gpu_sharing(pod)
                    or self.cache.podgroups.get(job_key) is not None)

    def _registrable(self, job_key: str) -> bool:
        """Whether the registry takes this PodGroup now: not one the loop asked to be written
        (a pod the cycle could not place) or the binder holds."""
        registry = self._registry()
        return registry is not None and registry.state(job_key) in (None, WAITING)

    def _defer(self, pod: Obj, owners: Owners, grouping: Grouping) -> bool:
        """Register the PodGroup of a deferrable pod (`_deferrable`) instead of writing it;
        False where it must be written (not deferrable, or the loop asked for it written)."""
        m = pod["metadata"]
        ns = m.get("namespace", "")
        job_key = f"{ns}/{grouping.name}"
        registry = self._registry()
        if registry is None or not self._deferrable(pod, owners, grouping):
            return False
        pg = grouping.podgroup
        # ordered by the pod's creation (the PodGroup would have been created with the pod);
        # the API server sets its own on create
        created = {"creationTimestamp": m["creationTimestamp"]} if m.get(
            "creationTimestamp") else {}
        return registry.add(f"{ns}/{m['name']}", job_key, {
            **pg, "metadata": {**pg["metadata"], "namespace": ns, **created}})

    def _registry(self) -> ProvisionalGroups | None:
        """Where bare pods' unwritten PodGroups are kept; None: every PodGroup is written at
        once (`defer_bare_pods` off, or a cache without the registry)."""
        return getattr(self.cache, "provisional", None) if self.defer_bare_pods else None

    def create_after_bind(self, podgroup: Obj) -> None:
        """Create the PodGroup of a bare pod the binder just bound, once the cycle's binds are
        done (`flush_after_binds`): off the bind path, on this grouper's client and its own
        rate limit (KAI's pod grouper is a process of its own). Until then the cache's
        provisional registry stands for it, so nothing waits on it; a bind phase of thousands
        of pods is not slowed by as many PodGroup creates on the same API server."""
        with self._after_binds_lock:
            self._after_binds.append(podgroup)

    def flush_after_binds(self) -> None:
        """The binder's phase ended: the PodGroups of the bare pods it bound go out now."""
        with self._after_binds_lock:
            todo, self._after_binds = self._after_binds, []
        for podgroup in todo:
            self.pool.submit(self._create_after_bind, podgroup)

    def _create_after_bind(self, podgroup: Obj) -> None:
        m = podgroup["metadata"]
        job_key = f"{m['namespace']}/{m['name']}"
        try:
            rawapi.create_custom(self.api, PODGROUP, m["namespace"],
                                 written_form(podgroup))
            return
        except ApiException as e:
            if e.status == 409:  # written meanwhile by a grouping pass: only the stamp is due
                start = (m.get("annotations") or {}).get(LAST_START_ANNOTATION)
                if start:
                    rawapi.annotate_quietly(self.api, PODGROUP, podgroup,
                                            {LAST_START_ANNOTATION: start})
                return
            why = _describe(e)
        except Exception as e:  # a reset or a timeout: as a refusal, grouped again
            why = _describe(e)
        log.warning("PodGroup %s of a bound pod not created (%s); the grouper writes it",
                    job_key, why)
        registry = self._registry()
        pod_key = registry.mark(job_key, WRITE) if registry is not None else None
        if pod_key:
            self.cache.regroup([pod_key])

    def _write_podgroup(self, ns: str, name: str, desired: Obj) -> None:
        current = self.cache.podgroups.get(f"{ns}/{name}")
        if current is None:
            # create first: for a new owner (the common case) that is one request, not a GET
            # and a create; 409 means it exists after all (the cache lags): read and update it
            try:
                rawapi.create_custom(self.api, PODGROUP, ns, desired)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = self.custom.get_namespaced_custom_object(
                    PODGROUP.group, PODGROUP.version, ns, PODGROUP.plural, name)
        if current is not None:
            updated = podgroup_update(current, desired, self.config)
            if updated is not None:
                self.custom.replace_namespaced_custom_object(PODGROUP.group, PODGROUP.version, ns,
                                                             PODGROUP.plural, name, updated)
