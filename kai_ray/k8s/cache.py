"""A watch cache of the objects the scheduler reads: list once, then follow the watch stream
(re-listing only when the server says the resourceVersion is too old). No full re-list per cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kai_ray import api_names
from kai_ray.api_names import PODGROUP, QUEUE
from kai_ray.core.model import Job, Node, PodStatus, Snapshot
from kai_ray.core.queuetree import queue_cycles
from kai_ray.k8s import convert, rawapi, trim
from kai_ray.k8s.gang_arrivals import GangArrivals
from kai_ray.k8s.provisional import ProvisionalGroups
from kai_ray.k8s.reads import JobReads, NodeReads, PodReads, object_key
from kai_ray.k8s.suspend import stand_in_pods

log = logging.getLogger(__name__)
Obj = dict[str, Any]
ListFn = Callable[..., Any]


OnChange = Callable[[str, Obj, "Obj | None"], None]  # (event, object, the one it replaced)


LIST_PAGE = 500  # objects per page of a list (the API server's default chunk size)
# a list's continue token, in the head of its page: the API server writes the list's metadata
# before its items; a token of other characters is simply not guessed
_CONTINUE = re.compile(rb'\{(?:"kind":"\w*",)?(?:"apiVersion":"[\w./-]*",)?'
                       rb'"metadata":\{[^{}]*?"continue":"([A-Za-z0-9+/=_-]+)"')


class _Fetch:
    """`fn(arg)` on a daemon thread of its own (a pool's threads are waited for at exit: a
    page still downloading would hold a stopping scheduler past its grace period)."""

    def __init__(self, fn: Callable[[Any], bytes], arg: Any, name: str) -> None:
        self._fn, self._arg = fn, arg
        self._value: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(self._arg)
        except BaseException as e:  # handed to the caller of result()
            self._error = e

    def result(self) -> bytes:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


def _continue_token(page: bytes) -> str | None:
    """The continue token at the head of a list page, if there plainly is one."""
    found = _CONTINUE.match(page, 0, 4096)
    return found.group(1).decode() if found else None


class Informer:
    """One kind of object, kept current in `items` by a background thread. `on_change` hears
    each event with the object the cache held before (None: it had none), so a hook can tell
    what changed.

    A watch is asked to end after `watch_timeout` seconds and is read with a timeout a little
    longer, so a connection that went silent (a half-open socket, a partitioned API server) is
    noticed and re-established; `last_contact` (monotonic) is the last time the API server
    answered, which the health endpoint reports."""

    def __init__(self, name: str, list_fn: ListFn, on_change: OnChange,
                 watch_timeout: int = 60,
                 transform: Callable[[Obj], Obj] | None = None,
                 connect_timeout: float = 5.0, list_timeout: float = 60.0,
                 refused_retry_s: float | None = None) -> None:
        """`transform`: applied to every object before it is kept (trims what the scheduler
        never reads); identity by default. `refused_retry_s`: for a kind that may be missing
        (another project's CRD) or not granted, a 403 or 404 answer waits this long (or until
        `wake()`) before the next try, and is logged when it starts and when it ends, not at
        every try; by default it is retried like any fault."""
        self.name = name
        self.transform = transform or (lambda obj: obj)
        self.list_fn = list_fn
        self.on_change = on_change
        self.items: dict[str, Obj] = {}
        self.lock = threading.RLock()
        self.synced = threading.Event()
        self.stopping = threading.Event()
        self.watch_timeout = watch_timeout
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout
        self.last_contact = time.monotonic()
        self.last_error: str | None = None
        self.refused_retry_s = refused_retry_s
        self.refused: ApiException | None = None  # the 403/404 answer of the last try, if any
        self._wake = threading.Event()  # a stop, or a reason to try a refused list again now
        self.thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """The stream ends at its next event or timeout (the thread is a daemon). Closing the
        response from here would block on the lock its reading thread holds."""
        self.stopping.set()
        self._wake.set()

    def wake(self) -> None:
        """Try a refused list again now (e.g. the kind was just seen served), not at the end of
        `refused_retry_s`."""
        if self.refused is not None:
            self._wake.set()

    def values(self) -> list[Obj]:
        with self.lock:
            return list(self.items.values())

    def get(self, key: str) -> Obj | None:
        with self.lock:
            return self.items.get(key)

    def silence(self) -> float:
        """Seconds since the API server last answered this informer."""
        return time.monotonic() - self.last_contact

    def _list(self) -> str:
        """List every object, in pages of `LIST_PAGE`, each trimmed before the next is read:
        one response of 50,000 pods is ~2.5 GB of Python objects at once, and the allocator
        keeps that much after they are freed (trimming after such a list saves nothing). An
        expired continue token is a 410, and `_run` lists again (backing off if it repeats)."""
        fresh: dict[str, Obj] = {}
        # the next page is asked for while this one is parsed (its continue token read from
        # the head of the response): the API server encodes it meanwhile, on the other core
        data = self._page(None)
        while True:
            guess = _continue_token(data)
            next_page = _Fetch(self._page, guess, f"list-{self.name}") if guess else None
            body = orjson.loads(data)
            del data
            for o in body.get("items") or []:
                fresh[object_key(o)] = self.transform(o)
            listed = body.get("metadata") or {}
            token = listed.get("continue")
            if not token:
                break
            if self.stopping.is_set():
                raise RuntimeError(f"list of {self.name} stopped")
            # the guess is only a shortcut: what the parsed page says decides
            data = next_page.result() if next_page is not None and token == guess \
                else self._page(token)
        if self.refused is not None:
            log.info("list of %s works again", self.name)
            self.refused = None
        with self.lock:
            before, self.items = self.items, fresh
        for key in set(before) - set(fresh):
            self.on_change("DELETED", before[key], before[key])
        for key, obj in fresh.items():
            self.on_change("ADDED", obj, before.get(key))
        self.synced.set()
        rv: str = listed.get("resourceVersion", "")
        return rv

    def _page(self, token: str | None) -> bytes:
        """One page of the list, as the API server's JSON."""
        page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
        resp = self.list_fn(_preload_content=False,
                            _request_timeout=(self.connect_timeout, self.list_timeout), **page)
        data: bytes = resp.data
        self.last_contact = time.monotonic()
        return data

    def _stream(self, rv: str) -> Iterator[Obj]:
        """The watch's events as plain dicts. Not `kubernetes.watch.Watch`: it would turn every
        object into the generated models first, the most CPU the scheduler spends on a busy
        cluster, for objects we only read as JSON."""
        resp = self.list_fn(watch=True, resource_version=rv, timeout_seconds=self.watch_timeout,
                            allow_watch_bookmarks=True, _preload_content=False,
                            _request_timeout=(self.connect_timeout, self.watch_timeout + 15))
        self.last_contact = time.monotonic()
        try:
            for line in iter_resp_lines(resp):
                if self.stopping.is_set():
                    return
                self.last_contact = time.monotonic()
                if line:
                    yield orjson.loads(line)
        finally:
            resp.release_conn()

    def _run(self) -> None:
        rv = ""
        failures = 0
        while not self.stopping.is_set():
            try:
                if not rv:
                    rv = self._list()
                for event in self._stream(rv):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":  # handled below: 410 lists again, others back off
                        raise ApiException(status=obj.get("code") or 0,
                                           reason=str(obj.get("message") or "watch ERROR"))
                    failures = 0  # the watch makes progress (an ERROR event is none)
                    if kind != "BOOKMARK":
                        obj = self.transform(obj)
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    key = object_key(obj)
                    with self.lock:
                        if kind == "DELETED":
                            old = self.items.pop(key, None)
                        else:
                            old = self.items.get(key)
                            self.items[key] = obj
                    self.on_change(kind, obj, old)
                failures = 0
                self.last_error = None
            except ApiException as e:
                if self.stopping.is_set():
                    return
                failures += 1
                if e.status == 410:
                    # a resourceVersion too old or an expired continue token: list again, at
                    # once the first time; `failures` is reset only by watch events, so a
                    # server answering 410 again (to a list, or to the watch after one) is
                    # backed off, not listed in full in a tight loop
                    rv = ""
                    if failures == 1:
                        continue
                if e.status in (403, 404) and self.refused_retry_s is not None:
                    self._refused(e)
                    rv = ""  # the kind may come back with none of what it held
                    continue
                self._failed(f"{e.status} {e.reason}", failures)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                # a timeout or a dropped connection: watch again from where we were (a
                # re-list of every object is the API server's most expensive request); a
                # resourceVersion it no longer has gets 410 and a re-list
                if self.stopping.is_set():
                    return
                failures += 1
                self._failed(f"{type(e).__name__}: {e}", failures)
            except Exception as e:  # anything else (a malformed line): start over
                if self.stopping.is_set():
                    return
                log.exception("watch %s broke; re-listing", self.name)
                rv = ""
                failures += 1
                self._failed(f"{type(e).__name__}: {e}", failures)

    def _refused(self, e: ApiException) -> None:
        if self.refused is None or self.refused.status != e.status:
            # a kind not served (404: another project's CRD, not installed) may be normal here
            log.log(logging.INFO if e.status == 404 else logging.WARNING,
                    "list of %s refused (%s %s); trying again every %.0fs", self.name,
                    e.status, e.reason, self.refused_retry_s)
        self.refused = e
        self.last_error = f"{e.status} {e.reason}"
        self._wake.wait(self.refused_retry_s)
        self._wake.clear()

    def _failed(self, error: str, failures: int) -> None:
        """Wait before the next try: jittered, doubling from 0.25 s to at most 4 s, so a
        recovered API server is watched again within seconds and restarting schedulers do
        not all call at once."""
        self.last_error = error
        delay = backoff_delay(failures)
        log.warning("watch %s failed (%s); retrying in %.1fs", self.name, error, delay)
        self.stopping.wait(delay)


def backoff_delay(failures: int, base: float = 0.25, cap: float = 4.0) -> float:
    """Delay before try number `failures` + 1: doubling from `base` up to `cap`, with full
    jitter over the upper half (never less than half the step)."""
    step = min(cap, base * 2 ** max(0, failures - 1))
    return step / 2 + random.random() * step / 2


class ClusterCache:
    """Nodes, pods, PodGroups, Queues and PriorityClasses, and the snapshot built from them."""

    def __init__(self, api: client.ApiClient, watch_timeout: int = 60,
                 connect_timeout: float = 5.0,
                 reservation_namespace: str = api_names.RESERVATION_NAMESPACE) -> None:
        """`watch_timeout`: seconds each watch lasts before it is opened again (a silent one
        is noticed that much later); `connect_timeout`: seconds to reach the API server;
        `reservation_namespace`: where the binder's GPU reservation pods live (its
        BinderConfig's), whose pods stand for shared devices."""
        self.reservation_namespace = reservation_namespace
        # plain GETs (kai_ray.k8s.rawapi.lister), not the generated API classes: CoreV1Api's
        # import alone takes 0.4 s of a start-up that schedules nothing until the lists are in
        nodes, pods = rawapi.lister(api, "/api/v1/nodes"), rawapi.lister(api, "/api/v1/pods")
        podgroups = rawapi.lister(api, PODGROUP.path())
        queues = rawapi.lister(api, QUEUE.path())
        classes = rawapi.lister(api, "/apis/scheduling.k8s.io/v1/priorityclasses")
        self.changed = threading.Event()
        # pods whose PodGroup membership must be (re)computed by the pod grouper, and the
        # grouper's wake-up: set (and counted) only for pod events that can change grouping
        self.dirty_pods: set[str] = set()
        self.pods_to_group = threading.Event()
        self.grouping_wakeups = 0
        self._dirty_lock = threading.Lock()
        # new work (a pending pod of ours or a PodGroup created, pods grouped): the loop
        # starts its next cycle early instead of at the end of its period
        self.arrivals = threading.Event()
        # and the moment one of them makes a gang whole: the loop need not pause for the rest
        self.gangs = GangArrivals()
        # bare pods' PodGroups the grouper has not written (kai_ray.k8s.provisional)
        self.provisional = ProvisionalGroups()
        self.pod_reads = PodReads()  # the snapshot's, kept between cycles
        self.node_reads = NodeReads()
        self.job_reads = JobReads()
        # each kind trimmed to what the scheduler reads (kai_ray.k8s.trim): ~7x less per pod
        self.nodes = Informer("nodes", nodes, self._touch, transform=trim.trim_node)
        self.pods = Informer("pods", pods, self._pod_changed, transform=trim.trim_pod)
        self.podgroups = Informer("podgroups", podgroups, self._podgroup_changed,
                                  transform=trim.trim_podgroup)
        self.queues = Informer("queues", queues, self._touch, transform=trim.trim_queue)
        self.priority_classes = Informer("priorityclasses", classes, self._touch,
                                         transform=trim.trim_priority_class)
        self.informers = [self.nodes, self.pods, self.podgroups, self.queues,
                          self.priority_classes]
        for inf in self.informers:
            inf.watch_timeout, inf.connect_timeout = watch_timeout, connect_timeout

    def _touch(self, kind: str, obj: Obj, old: Obj | None) -> None:
        self.changed.set()

    def _pod_changed(self, kind: str, obj: Obj, old: Obj | None) -> None:
        ours = convert.is_ours(obj)
        joined = self.gangs.pod_event(kind, object_key(obj), obj, old) if ours else None
        unbound = not (obj.get("spec") or {}).get("nodeName")
        if kind != "DELETED" and ours and may_regroup(obj, old):
            with self._dirty_lock:
                self.dirty_pods.add(object_key(obj))
                self.grouping_wakeups += 1
                self.pods_to_group.set()
            if kind == "ADDED" and unbound:
                self.arrivals.set()
        if joined is not None and unbound \
                and self.gangs.check(joined, self.podgroups.get(joined)):
            self.arrivals.set()  # a pod the grouper annotated arrives as MODIFIED
        self.changed.set()

    def _podgroup_changed(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind == "ADDED":
            self.gangs.check(object_key(obj), obj)
            self.arrivals.set()
        self.changed.set()

    def regroup(self, pod_keys: Iterable[str]) -> None:
        """Have the pod grouper look at these pods again, now."""
        with self._dirty_lock:
            self.dirty_pods.update(pod_keys)
            self.pods_to_group.set()

    def take_dirty_pods(self) -> list[str]:
        with self._dirty_lock:
            keys, self.dirty_pods = sorted(self.dirty_pods), set()
            self.pods_to_group.clear()
        return keys

    def check_crds(self) -> None:
        """Fail with instructions when KAI's CRDs are missing, instead of waiting forever."""
        for inf, crd in ((self.podgroups, PODGROUP.crd_name),
                         (self.queues, QUEUE.crd_name)):
            try:
                inf.list_fn(limit=1, _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    raise RuntimeError(
                        f"the {crd} CRD is not installed in this cluster; install kai-ray's "
                        "CRDs first (helm install, or kubectl apply -f kai_ray/k8s/crds/)") from e
                raise

    def start(self, timeout: float = 60.0) -> None:
        began = time.monotonic()
        self.check_crds()
        for inf in self.informers:
            inf.start()
        deadline = time.monotonic() + timeout
        for inf in self.informers:
            if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
                # the last error says why (403: the RBAC lacks list/watch on the kind)
                raise TimeoutError(f"cache: {inf.name} did not sync within {timeout:.0f}s"
                                   + (f" (last error: {inf.last_error})" if inf.last_error
                                      else ""))
        log.info("cache synced in %.1fs: %s", time.monotonic() - began,
                 ", ".join(f"{len(inf.items)} {inf.name}" for inf in self.informers))

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()

    def list_once(self) -> None:
        """Fill the cache by one list of each kind, with no watch threads: for a one-shot
        command, which must exit cleanly (`kai-ray explain`, `queues`, `snapshot`)."""
        self.check_crds()
        for inf in self.informers:
            inf._list()

    # -------------------------------------------------------------------------------- snapshot
    def snapshot(self) -> tuple[Snapshot, list[convert.Problem], dict[str, Obj]]:
        """(snapshot, problems found while reading it, PodGroups by job key (`ns/name`)).

        A malformed object is one Problem naming it and the field, never an exception: it is
        left out of the snapshot, and what it holds on a node is counted as foreign use of that
        node, so its room is not given away twice: a bound pod of ours that cannot be read,
        the bound pods of a PodGroup that cannot, and a left-out pod its PodGroup's bind intent
        names but that is not bound yet (on the intent's node, with the shared devices the
        intent names that no readable pod holds). The binder resumes only the readable
        PodGroups returned here, so an unreadable PodGroup's intent is held, not bound, until
        the PodGroup is fixed. A live reservation pod stands for its shared device, which the
        core counts through its sharers; one whose device no readable pod shares (its sharers
        left out, or gone) is foreign use too."""
        problems: list[convert.Problem] = []
        by_group: dict[tuple[str, str], list[Obj]] = {}
        foreign: dict[str, list[int]] = {}
        reservations: list[Obj] = []  # live reservation pods (decided on once jobs are read)
        intent_devices: set[tuple[str, str]] = set()  # (node, group) left-out intents hold
        provisional, provisional_pods = self.provisional.view() if len(self.provisional) \
            else ({}, {})
        live: set[str] = set()
        for pod in self.pods.values():
            m = pod.get("metadata") or {}
            if convert.is_ours(pod):
                group = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
                if provisional:
                    key = f"{m.get('namespace', '')}/{m.get('name')}"
                    live.add(key)
                if not group and provisional:  # a bare pod whose PodGroup is not written yet
                    job_key = provisional_pods.get(key)
                    group = job_key.split("/", 1)[1] if job_key else None
                if group:
                    by_group.setdefault((m.get("namespace", ""), group), []).append(pod)
                continue
            if m.get("namespace") == self.reservation_namespace \
                    and not m.get("deletionTimestamp"):
                reservations.append(pod)
                continue
            # a terminating reservation pod (rolled back, or its last sharer gone) holds its
            # GPU until the kubelet lets go: counted as foreign use, no group stands for it
            bad = convert.sharing_problem(pod)
            if bad is not None and _holds_node(pod):
                problems.append(_pod_problem(pod, bad, " (ignored: kai-scheduler does not "
                                             "place this pod; counted by its resources)"))
            _count_foreign(foreign, pod, problems)
        classes, default = self._priority_classes(problems)
        class_key = (tuple(classes.items()), default)
        jobs = []
        podgroups: dict[str, Obj] = {}
        written = {f"{pg['metadata'].get('namespace', '')}/{pg['metadata']['name']}"
                   for pg in self.podgroups.values()} if provisional else set()
        if provisional:
            self.provisional.prune(live, written)
        unwritten = [pg for key, pg in provisional.items() if key not in written]
        for pg in [*self.podgroups.values(), *unwritten]:
            m = pg["metadata"]
            # a gang suspended by preemption (a RayJob) keeps its demand as stand-in pods
            members = by_group.pop((m.get("namespace", ""), m["name"]), None)
            if not members:
                try:
                    members = stand_in_pods(pg)
                except _BAD as e:  # a hand-edited demand annotation
                    problems.append(_problem("PodGroup", pg, e, "metadata.annotations"))
                    continue
            key = f"{m.get('namespace', '')}/{m['name']}"
            job = self.job_reads.get(key, pg, members, class_key)
            left_out: list[Obj] = []
            if job is not None:
                self.pod_reads.seen(members)
            else:
                job, left_out = _job_or_problems(pg, members, classes, default, problems,
                                                 self.pod_reads.read)
                if job is not None and not left_out:
                    self.job_reads.keep(key, pg, members, class_key, job)
            intent = convert.bind_intent(pg) if left_out else {}
            for pod in left_out:  # what they hold (or their intent holds) on nodes stays held
                at, groups = _intent_place(pod, intent)
                _count_foreign(foreign, pod, problems, at)
                intent_devices.update((at, g) for g in groups if at)
            if job is None:
                continue
            jobs.append(job)
            # by job key (namespace and name); a copy of what the binder updates in place
            # (annotations, resourceVersion): the informer's object is shared with the pod
            # grouper's thread, which must never see one half-updated
            m = pg["metadata"]
            podgroups[job.name] = {**pg, "metadata": {**m, "annotations": dict(
                m.get("annotations") or {})}}
        for members in by_group.values():  # pods of ours whose PodGroup is missing
            for pod in members:
                _count_foreign(foreign, pod, problems)
        _count_unshared_devices(foreign, jobs, reservations, intent_devices, problems)
        nodes: list[Node] = []
        node_objs = self.nodes.values()
        for obj in node_objs:
            try:
                node = self.node_reads.read(obj, problems)
            except (ValueError, KeyError, TypeError, ArithmeticError) as e:
                problems.append(_problem("Node", obj, e, "status.allocatable"))
                continue
            used = foreign.get(node.name)
            if used:
                node = Node(**{**_fields(node), "foreign_cpu_m": used[0],
                               "foreign_memory": used[1], "foreign_gpus": used[2],
                               "foreign_pods": used[3]})
            nodes.append(node)
        queues = []
        for obj in self.queues.values():
            try:
                q = convert.queue_from(obj)
            except (ValueError, KeyError, TypeError, ArithmeticError) as e:
                q = _problem("Queue", obj, e, "spec")
            if isinstance(q, convert.Problem):
                problems.append(q)
            else:
                queues.append(q)
        # the core leaves queues on a parent cycle out (and all below them); the Queue says why
        for name, cycle in queue_cycles(queues).items():
            problems.append(convert.Problem(
                "Queue", None, name, "spec.parentQueue",
                f"on a parent cycle ({' -> '.join((*cycle, cycle[0]))}): this queue and the "
                "queues under it run nothing until one spec.parentQueue on the cycle changes",
                uid=str(((self.queues.get(name) or {}).get("metadata") or {}).get("uid")
                        or "")))
        for reads in (self.pod_reads, self.job_reads, self.node_reads):
            reads.forget_unseen()
        return Snapshot(tuple(nodes), tuple(queues), tuple(jobs),
                        tuple(classes.items())), problems, podgroups

    def _priority_classes(self, problems: list[convert.Problem]
                          ) -> tuple[dict[str, int], int | None]:
        classes: dict[str, int] = {}
        default = None
        for pc in self.priority_classes.values():
            name = pc["metadata"]["name"]
            value = pc.get("value", 0)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(convert.Problem("PriorityClass", None, name, "value",
                                                f"must be an integer, got {value!r}"))
                continue
            classes[name] = value
            if pc.get("globalDefault"):
                default = value
        return classes, default


# anything a malformed object can raise in conversion (a list where a mapping belongs raises
# AttributeError): one Problem, never a failed snapshot
_BAD = (ValueError, KeyError, TypeError, ArithmeticError, AttributeError, IndexError)


def _problem(kind: str, obj: Obj, error: Exception, field: str) -> convert.Problem:
    """A Problem on `obj` from the error its conversion raised (its field when it names one)."""
    m = obj.get("metadata") or {}
    if isinstance(error, convert.InvalidField):
        field, message = error.field, error.message
    else:
        message = f"{type(error).__name__}: {error}" if isinstance(error, KeyError) \
            else str(error)
    return convert.Problem(kind, m.get("namespace"), str(m.get("name", "?")), field, message,
                           uid=str(m.get("uid") or ""))


def _pod_problem(pod: Obj, error: convert.InvalidField, note: str = "") -> convert.Problem:
    m = pod.get("metadata") or {}
    return convert.Problem("Pod", m.get("namespace"), str(m.get("name", "?")), error.field,
                           error.message + note, uid=str(m.get("uid") or ""))


def _holds_node(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _count_foreign(foreign: dict[str, list[int]], pod: Obj,
                   problems: list[convert.Problem], node: str | None = None) -> None:
    """Add what `pod` holds on `node` (by default the node it is bound to, if it holds one:
    its containers' resources, as the kubelet counts them) to the node's foreign use."""
    if node is None:
        if not _holds_node(pod):
            return
        node = pod["spec"]["nodeName"]
    try:
        req = convert.pod_request(pod, sharing=False)
    except _BAD as e:  # a quantity the API server should have refused
        problems.append(_problem("Pod", pod, e, "spec.containers"))
        return
    usage = foreign.setdefault(node, [0, 0, 0, 0])
    usage[0] += req.cpu_m
    usage[1] += req.memory
    usage[2] += req.gpus
    usage[3] += 1


def _intent_place(pod: Obj, intent: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """(node, shared-device groups) the bind intent names for `pod` while the pod is not
    bound yet and may still be (the binder skips a terminating pod); (None, ()) otherwise.
    Read leniently: an entry hand-edited out of shape holds nothing (the binder drops it)."""
    m, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") or m.get("deletionTimestamp") \
            or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None, ()
    entry = intent.get(str(m.get("name")))
    if not isinstance(entry, dict) or not isinstance(entry.get("node"), str) \
            or not entry["node"]:
        return None, ()
    groups = entry.get("gpu_groups")
    return entry["node"], tuple(g for g in groups if isinstance(g, str) and g) \
        if isinstance(groups, list) else ()


_FINISHED = (PodStatus.SUCCEEDED, PodStatus.FAILED)


def _count_unshared_devices(foreign: dict[str, list[int]], jobs: list[Job],
                            reservations: list[Obj], intent_devices: set[tuple[str, str]],
                            problems: list[convert.Problem]) -> None:
    """Count as foreign use the shared devices no readable pod stands for. The core counts a
    shared device through the gpu groups of the pods sharing it; when all of them are left
    out (bad pods, an unreadable PodGroup) or gone, the device would look free while its
    reservation pod holds the whole GPU (the left-out sharers are counted with sharing=False:
    a fraction is 0 GPUs). So: a live, bound reservation pod whose group no unfinished pod of
    a readable job names counts by its resources; a device a left-out pod's intent names,
    with no such reservation pod yet (created at bind time, or collected meanwhile), counts
    as one GPU on the intent's node. A sharer bound this cycle whose labels the pod watch has
    not shown yet (its intent already cleared) may make a device counted twice for a cycle:
    room held, never given away twice."""
    shared = {g for job in jobs for p in job.pods if p.status not in _FINISHED
              for g in p.gpu_groups}
    reserved = set()
    for pod in reservations:
        if not _holds_node(pod):
            continue
        group = ((pod.get("metadata") or {}).get("labels") or {}).get(api_names.GPU_GROUP_LABEL)
        reserved.add((pod["spec"]["nodeName"], group))
        if group not in shared:
            _count_foreign(foreign, pod, problems)
    for node, group in intent_devices - reserved:
        if group not in shared:
            foreign.setdefault(node, [0, 0, 0, 0])[2] += 1


def _job_or_problems(pg: Obj, members: list[Obj], classes: dict[str, int],
                     default: int | None, problems: list[convert.Problem],
                     read_pod: convert.PodReader | None = None
                     ) -> tuple[Job | None, list[Obj]]:
    """(the job of `pg`, the members left out of it). A member pod that cannot be read is a
    Problem of its own and left out; a PodGroup that cannot be read is one Problem (no job,
    every member left out)."""
    try:
        return convert.job_from(pg, members, classes, default, read_pod), []
    except _BAD as e:
        error: Exception = e
    good: list[Obj] = []
    bad: list[Obj] = []
    for pod in members:
        try:
            convert.pod_from(pod)
        except _BAD as e:
            problems.append(_problem("Pod", pod, e, "spec"))
            bad.append(pod)
            continue
        good.append(pod)
    if bad:
        try:
            return convert.job_from(pg, good, classes, default, read_pod), bad
        except _BAD as e:
            error = e
    problems.append(_problem("PodGroup", pg, error, "spec"))
    return None, members


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
    return {object_key(o): o for o in items}
