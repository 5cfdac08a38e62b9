"""Carries a cycle's decisions out on the API server.

Crash safety: before binding any pod of a gang, the binder writes the gang's whole set of
decisions in one atomic write, an annotation on the PodGroup (`kai-ray.io/bind-intent`). The
cache reads intents back as pods in state Binding, so after a crash the restarted scheduler
neither re-decides them nor gives their room away, and `resume()` finishes the binds. A gang is
therefore never left partly bound by a crash.

GPU sharing as KAI does it: one reservation pod per shared device (in the configured
reservation namespace, KAI's `kai-resource-reservation` by default; `nvidia.com/gpu: 1`, pinned
to the node) whose own program (`kai_ray.reservation`) reports the physical GPU id in
annotation `run.ai/reserve_for_gpu_index`; sharing pods carry label `runai-gpu-group` and get a
per-pod ConfigMap with NVIDIA_VISIBLE_DEVICES and GPU_PORTION.

The binder never waits for a reservation pod. A sharing pod whose device has not been reported
yet stays in its gang's bind intent (so it keeps its place, as Binding) and is bound by a later
cycle's `resume()` once the annotation is there. A reservation pod that fails, that cannot be
created, or that reports nothing within `reservation_timeout_s` of when this scheduler first
created or saw it (a restart starts the count again; re-creating the same pod does not), is
deleted and its waiting pods are taken out of the intent (back to Pending, their capacity
released), with an event and a PodScheduled condition on each that name the reservation pod.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import __version__, api_names
from kai_ray.api_names import GPU_GROUP_LABEL, PODGROUP
from kai_ray.core.result import Bind, CycleResult
from kai_ray.grouping import admission
from kai_ray.k8s import convert, rawapi
from kai_ray.k8s.client import LazyCoreV1Api
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.fencing import MIN_LEASE_LEFT_S, Fenced, fenced_timeout
from kai_ray.k8s.provisional import WAITING, ProvisionalGroups, is_provisional, written_form
from kai_ray.k8s.ratelimit import DEFAULT_TIMEOUT
from kai_ray.k8s.status import not_scheduled

log = logging.getLogger(__name__)
Obj = dict[str, Any]

RESERVATION_APP = "kai-resource-reservation"
GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
CONFIGMAP_ANNOTATION = api_names.SHARED_GPU_CONFIGMAP_ANNOTATION


RESERVATION_IMAGE = f"ghcr.io/kai-ray/reservation:{__version__}"
RESERVATION_SERVICE_ACCOUNT = "kai-ray-reservation"
RESERVATION_UID = 65532
# the reservation namespace holds nothing but reservation pods: the strictest standard fits
PSS_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}


@dataclass
class BinderConfig:
    # from when the binder first created or saw a reservation pod until it must have reported
    reservation_timeout_s: float = 120.0
    # gangs bound at the same time: a Binding waits on the API server far longer than it
    # takes here, and kube-scheduler binds each pod in a goroutine of its own. 9,000 pods on
    # 1,000 nodes (benchmarks/bind_throughput.py): 16 -> ~200 pods/s, 64 -> 325, 128 -> 400
    workers: int = 128
    # a gang's pods after its first are sent this many at a time (one pool for all gangs; a
    # gang binds a pod of its own still queued there itself), once the first bind went
    # through (1: one after another). A refusal then may find later pods of the gang bound;
    # they are recorded in its intent, and a rollback evicts them as any other bound pod.
    gang_bind_workers: int = 8
    # kai-ray's (operator/reservation.Dockerfile); KAI's resource-reservation image works too
    reservation_image: str = RESERVATION_IMAGE
    reservation_service_account: str = RESERVATION_SERVICE_ACCOUNT
    # the namespace of the reservation pods (and of their ServiceAccount); the cache must be
    # given the same one (ClusterCache(reservation_namespace=...))
    reservation_namespace: str = api_names.RESERVATION_NAMESPACE
    # refused binds of one pod (one try per cycle) before it and its gang's unbound pods go
    # back to Pending with a BindFailed condition and a back-off; 404 (gone) and 409 (bound)
    # are not failures, and transient faults (resets, timeouts, 429, 5xx) are retried with a
    # back-off of their own, never given up: giving up would split a half-bound gang
    bind_attempts: int = 5
    # transient bind faults: seconds before the next try of that pod, doubling to the maximum
    retry_s: tuple[float, float] = (1.0, 30.0)
    # a gang's bind transaction (its intent) not whole this long after it was written is
    # rolled back: the pods it bound are evicted, the rest go back to Pending. Longer than
    # reservation_timeout_s, which a shared-GPU pod may legitimately wait.
    bind_deadline_s: float = 300.0


class StaleRead(RuntimeError):
    """An object changed since the cache read it: a transient outcome (the next cycle reads
    it anew), never a refusal."""


class ReservationFailed(RuntimeError):
    """A reservation pod failed or never reported; the message names it and says why."""

    def __init__(self, pod_name: str, message: str) -> None:
        super().__init__(message)
        self.pod_name = pod_name


def _is_reservation(pod: Obj, config: BinderConfig) -> bool:
    m = pod.get("metadata") or {}
    return m.get("namespace") == config.reservation_namespace \
        and (m.get("labels") or {}).get("app") == RESERVATION_APP


class Binder:
    def __init__(self, api: client.ApiClient, events: EventRecorder,
                 config: BinderConfig | None = None,
                 bind_api: client.ApiClient | None = None) -> None:
        """`bind_api`: the client the Bindings go out on (default `api`): `kai-ray run` gives
        them a rate limit of their own, as KAI's binder is a process of its own."""
        self.api = api
        self.bind_api = bind_api or api
        self.core = LazyCoreV1Api(api)  # its import is slow: made on first use
        self.custom = client.CustomObjectsApi(api)
        self.events = events
        self.config = config or BinderConfig()
        self.bound_total = 0
        self._count_lock = threading.Lock()  # gangs bind on the pool's threads
        self.reservation_ns_ready = False
        # reservation pod name -> when this binder first created or saw it unreported
        # (monotonic); kept across re-creations of the same name until it reports or fails
        self._waiting_since: dict[str, float] = {}
        # what the last call bound: apply_binds (keys) and resume (Binds); the loop assumes them
        self.last_bound: set[str] = set()
        self.resumed: list[Bind] = []
        # pod key -> refused binds so far; pod key -> (next try (monotonic), transient faults
        # in a row); pods given up by the last call -> why (the loop backs them off before
        # they are scheduled again)
        self._attempts: dict[str, int] = {}
        self._retry_at: dict[str, tuple[float, int]] = {}
        self.gave_up: dict[str, str] = {}
        self._bound_now: list[Bind] = []
        # reservation pods by (node, group), indexed once per call from the pods it was given
        self._reservations: dict[tuple[str, str], Obj] | None = None
        self.pool = ThreadPoolExecutor(max_workers=max(1, self.config.workers),
                                       thread_name_prefix="binder")
        # a pool of its own: a gang bound on `pool` waits for these, never the other way
        self.gang_pool = ThreadPoolExecutor(max_workers=max(1, self.config.gang_bind_workers),
                                            thread_name_prefix="gang-bind")
        # the watch cache's nodes by name, when the caller gives them: resume() re-checks that
        # a node it is about to bind to still exists
        self.nodes: Mapping[str, Obj] | None = None
        # seconds this replica surely leads (LeaderElector.lease_left; inf without election,
        # 0 once stopping): every bind, intent write and eviction is made only with
        # MIN_LEASE_LEFT_S left, with a request timeout that ends within it, so a replica that
        # lost its lease has stopped writing before a standby can take over
        self.fence: Callable[[], float] = lambda: math.inf
        self.fenced = 0  # gangs whose binds stopped for it (a test and the log read it)
        # bare pods scheduled before their PodGroup is written: the registry (the cache's)
        # and who creates the PodGroup once the pod is bound (the pod grouper, when it runs)
        self.provisional: ProvisionalGroups | None = None
        self.create_podgroup: Callable[[Obj], None] = self._create_podgroup
        # called when apply_binds ends (the pod grouper sends the PodGroups it was handed)
        self.after_binds: Callable[[], None] = lambda: None

    def write_timeout(self) -> tuple[float, float] | None:
        """The (connect, read) timeout of a fenced write; raises Fenced when too little
        leadership is left. None: no election, the client's own timeout."""
        return fenced_timeout(self.fence, getattr(self.api, "timeout", DEFAULT_TIMEOUT))

    # ------------------------------------------------------------------ intents
    def _patch_pg_annotations(self, pg: Obj, annotations: Mapping[str, str | None],
                              guarded: bool = False) -> None:
        """`guarded`: only if the PodGroup is still the version read (409 otherwise: another
        replica, or a user, changed it since; the gang is decided again next cycle)."""
        m = pg["metadata"]
        meta: Obj = {"annotations": dict(annotations)}
        if guarded and m.get("resourceVersion"):
            meta["resourceVersion"] = m["resourceVersion"]
        answer = rawapi.request_json(
            self.api, "PATCH", PODGROUP.path(m["namespace"], m["name"]), {"metadata": meta},
            rawapi.MERGE_PATCH,
            timeout=self.write_timeout())
        version = (answer.get("metadata") or {}).get("resourceVersion")
        if version:  # a later guarded write of this cycle starts from this version
            m["resourceVersion"] = version

    def write_intent(self, pg: Obj, binds: list[Bind], start: bool = False,
                     pods: Mapping[str, Obj] | None = None) -> None:
        """`start`: the job starts with these binds; its last-start stamp is written with the
        first bind that succeeds, in this cycle or (waiting for a reservation pod) a later one.
        Each entry names its pod's uid (from `pods`): a pod deleted and made again under the
        same name is not the one decided on."""
        intent = convert.bind_intent(pg)
        now = round(time.time(), 3)
        for b in binds:
            uid = ((pods or {}).get(f"{b.namespace}/{b.pod}") or {}).get(
                "metadata", {}).get("uid")
            intent[b.pod] = {"node": b.node, "gpu_groups": list(b.gpu_groups),
                             "new_gpu_groups": list(b.new_gpu_groups),
                             "portion": b.gpu_portion, "memory_mib": b.gpu_memory_mib,
                             "since": now, **({"uid": uid} if uid else {})}
            if start:
                intent[b.pod]["start"] = True
        self._patch_pg_annotations(pg, {api_names.BIND_INTENT_ANNOTATION: json.dumps(intent)},
                                   guarded=True)
        pg["metadata"].setdefault("annotations", {})[api_names.BIND_INTENT_ANNOTATION] = \
            json.dumps(intent)

    def resume(self, podgroups: Iterable[Obj], pods: dict[str, Obj]) -> int:
        """Finish binds a previous run (or cycle) recorded but did not complete. A gang that
        fails is that gang's outcome: logged, retried next cycle, never raised."""
        self._start_call(pods)

        def one(pg: Obj, intent: dict[str, Any]) -> int:
            try:
                return self._resume_gang(pg, intent, pods)
            except Exception:  # one gang's fault must not stop the others
                log.exception("PodGroup %s: resuming its binds failed", pg["metadata"]["name"])
                return 0

        gangs = [(pg, intent) for pg in podgroups if (intent := convert.bind_intent(pg))]
        done = self._each_gang(one, gangs)
        self.resumed = list(self._bound_now)
        return done

    def _each_gang(self, fn: Any, gangs: list[tuple[Any, Any]]) -> int:
        """`fn(*gang)` for each gang, concurrently on the pool (gangs are independent; each
        gang's pods are bound in order); the sum of what they bound."""
        if len(gangs) <= 1 or self.config.workers <= 1:
            return sum(fn(*g) for g in gangs)
        return sum(f.result() for f in [self.pool.submit(fn, *g) for g in gangs])

    def _resume_gang(self, pg: Obj, intent: dict[str, Any], pods: dict[str, Obj]) -> int:
        ns = pg["metadata"]["namespace"]
        binds, unreadable = [], []
        for name, v in intent.items():
            b = _intent_bind(convert.job_key(ns, pg["metadata"]["name"]), ns, name, v)
            if b is None or not is_member(pg, pods.get(f"{ns}/{name}"), v):
                unreadable.append(name)
            elif not v.get("bound"):
                binds.append(b)
        if unreadable:  # edited by hand, or its pod gone or made anew: never acted on
            log.warning("PodGroup %s/%s: bind intent entries dropped (unreadable, or not a "
                        "pod of this gang as decided): %s", ns, pg["metadata"]["name"],
                        sorted(unreadable))
            self._settle_intent(pg, (), unreadable, {})
        rolling = next((v["rollback"] for v in intent.values()
                        if isinstance(v, dict) and v.get("rollback")), None)
        if rolling:  # a rollback not finished (an eviction refused for now): go on with it
            self._roll_back(pg, pods, str(rolling))
            return 0
        if not binds and not unreadable:  # every entry bound: a crash came before the clean-up
            self._write_intent_value(pg, None, {})
            return 0
        why = self._cannot_finish(intent, binds, pods)
        if why:
            self._roll_back(pg, pods, why)
            return 0
        started = ({api_names.LAST_START_ANNOTATION: convert.now_rfc3339()}
                   if any(isinstance(v, dict) and v.get("start") for v in intent.values())
                   else None)
        return self._bind_gang(pg, binds, pods, started=started)

    def _cannot_finish(self, intent: dict[str, Any], binds: list[Bind],
                       pods: dict[str, Obj]) -> str | None:
        """Why the gang's transaction must be rolled back instead of resumed, re-checked each
        time before it goes on: past its deadline, or a node it binds to is gone."""
        waiting = [b for b in binds if not (pods.get(f"{b.namespace}/{b.pod}") or {}).get(
            "spec", {}).get("nodeName")]
        if not waiting:
            return None
        since = [v["since"] for v in intent.values() if isinstance(v, dict)
                 and isinstance(v.get("since"), int | float)]
        if since and time.time() - min(since) > self.config.bind_deadline_s:
            return (f"the gang was not bound whole within {self.config.bind_deadline_s:.0f}s "
                    f"({len(waiting)} pod(s) still unbound, e.g. {waiting[0].pod} on "
                    f"{waiting[0].node})")
        if self.nodes is not None:
            for b in waiting:
                node = self.nodes.get(b.node)
                if node is None or (node.get("metadata") or {}).get("deletionTimestamp"):
                    return f"node {b.node}, where {b.pod} was to be bound, is gone"
        return None

    def _start_call(self, pods: dict[str, Obj]) -> None:
        self._bound_now = []
        self._reservations = None
        self.gave_up = {}
        for counters in (self._attempts, self._retry_at):
            for key in [k for k in counters if k not in pods
                        or (pods[k].get("spec") or {}).get("nodeName")]:
                del counters[key]  # deleted or bound meanwhile

    # ------------------------------------------------------------------ binds
    def apply_binds(self, result: CycleResult, podgroups: dict[str, Obj],
                    pods: dict[str, Obj], starting: Collection[str] = ()) -> int:
        """Bind the cycle's decisions, gangs concurrently. Jobs in `starting` (none of their
        pods ran before) get the last-start annotation once a bind succeeded, in the same
        PodGroup patch that clears a gang's intent (a separate one for a single pod)."""
        self._start_call(pods)
        by_job: dict[str, list[Bind]] = {}
        for b in result.binds:
            by_job.setdefault(b.job, []).append(b)

        def one(job: str, binds: list[Bind]) -> int:
            try:
                return gang(job, binds)
            except Exception:  # one gang's fault is that gang's outcome
                log.exception("PodGroup %s: binding failed", job)
                return 0

        def gang(job: str, binds: list[Bind]) -> int:
            pg = podgroups.get(job)
            if pg is None:
                return 0
            stamp = ({api_names.LAST_START_ANNOTATION: convert.now_rfc3339()} if job in starting
                     else {})
            if is_provisional(pg):
                return self._bind_bare_pod(job, pg, binds, pods, stamp)
            if len(binds) == 1 and not binds[0].gpu_groups:
                # one Binding is atomic: nothing can be left half done, no intent needed (a
                # shared-GPU pod has one: it may wait cycles for its reservation pod)
                done = self._bind_gang(pg, binds, pods, intent=False)
                if done and stamp:
                    rawapi.annotate_quietly(self.api, PODGROUP, pg, stamp)
                return done
            try:
                self.write_intent(pg, binds, start=bool(stamp), pods=pods)
            except Exception as e:  # refused, timed out, reset: next cycle
                log.warning("PodGroup %s: bind intent not written (%s); skipping its binds",
                            job, getattr(e, "status", None) or f"{type(e).__name__}: {e}")
                return 0
            return self._bind_gang(pg, binds, pods, started=stamp)

        try:
            done = self._each_gang(one, list(by_job.items()))
        finally:
            self.after_binds()
        self.last_bound = {f"{b.namespace}/{b.pod}" for b in self._bound_now}
        return done

    def _bind_bare_pod(self, job: str, pg: Obj, binds: list[Bind], pods: dict[str, Obj],
                       stamp: dict[str, str]) -> int:
        """A bare pod whose PodGroup is not written yet (kai_ray.k8s.provisional): bound with
        `pod-group-name` on its Binding, then its PodGroup is created, stamped with the start.
        Two writes on its way to the node (the Binding, its event), as kube-scheduler's."""
        if len(binds) != 1 or binds[0].gpu_groups or self.provisional is None \
                or not self.provisional.claim_for_bind(job):
            log.info("PodGroup %s: not bound as a bare pod (being written); next cycle", job)
            return 0
        name = pg["metadata"]["name"]
        done = self._bind_gang(pg, binds, pods, intent=False,
                               annotations={api_names.POD_GROUP_ANNOTATION: name})
        if not done:
            self.provisional.mark(job, WAITING)
            return 0
        m = pg["metadata"]
        body = {**pg, "metadata": {**m, "annotations": {**(m.get("annotations") or {}),
                                                        **stamp}}}
        self.create_podgroup(body)
        return done

    def _create_podgroup(self, podgroup: Obj) -> None:
        """Without a pod grouper to hand it to (tests, tools): created here."""
        m = podgroup["metadata"]
        try:
            rawapi.create_custom(self.api, PODGROUP, m["namespace"],
                                 written_form(podgroup))
        except Exception as e:  # the grouper, when there is one, writes it on its next pass
            log.warning("PodGroup %s/%s of a bound pod not created: %s", m["namespace"],
                        m["name"], describe_error(e))

    def _bind_gang(self, pg: Obj, binds: list[Bind], pods: dict[str, Obj],
                   intent: bool = True, started: dict[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None) -> int:
        """Bind `binds` in order: the first alone, then (a gang, with its intent written) the
        plain binds of the rest sent together (`_send_ahead`), their answers taken in order.
        A failed bind stops the gang's binds for this call (the rest stay in the intent; a
        later cycle goes on); binds sent with it that went through count as bound. A refused
        first bind sends nothing more. A transient fault is retried after a back-off for as
        long as it lasts; after `bind_attempts` refusals of one pod, it and the gang's other
        unbound pods leave the intent and go back to Pending, and what the intent bound is
        rolled back."""
        bound: list[str] = []
        dropped: list[str] = []
        done = 0
        ahead: dict[int, Future[None]] = {}  # binds sent before their turn (_send_ahead)

        def drain() -> None:
            """Binds sent ahead of a stop: those that went through are bound pods of the
            gang (in the intent as such); a failed one stays in the intent for later."""
            nonlocal done
            for j, sent in sorted(ahead.items()):
                if sent.cancel():
                    continue  # not started: it keeps its place in the intent, unbound
                r = binds[j]
                pod = pods[f"{r.namespace}/{r.pod}"]
                try:
                    sent.result()
                except Exception as e:
                    if isinstance(e, ApiException) and e.status == 409:
                        pass  # bound already (an earlier try that landed): bound
                    else:
                        if is_transient(e):
                            self._retry_later(pod, r, describe_error(e))
                        else:
                            log.info("bind %s/%s -> %s (sent ahead): %s; a later cycle "
                                     "goes on", r.namespace, r.pod, r.node, describe_error(e))
                        continue
                bound.append(r.pod)
                done += 1
                self._note_bound(r, pod)
            ahead.clear()

        for i, b in enumerate(binds):
            key = f"{b.namespace}/{b.pod}"
            pod = pods.get(key)
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                dropped.append(b.pod)  # gone: nothing to finish
                continue
            if (pod.get("spec") or {}).get("nodeName"):
                bound.append(b.pod)
                continue
            if time.monotonic() < self._retry_at.get(key, (0.0, 0))[0]:
                break  # backing off after a transient fault: the gang waits in its intent
            if self.fence() < MIN_LEASE_LEFT_S:
                with self._count_lock:
                    self.fenced += 1
                log.warning("PodGroup %s: binds stopped, this replica may no longer lead; "
                            "the gang's intent is left for the next leader",
                            pg["metadata"]["name"])
                break
            try:
                if b.gpu_groups:
                    devices = self._reserved_devices(pod, b, pods)
                    if devices is None:
                        continue  # stays in the intent: a later cycle binds it
                    self._prepare_shared_gpu(pod, b, devices)
                sent = ahead.pop(i, None)
                if sent is not None and not sent.cancel():
                    sent.result()  # what the bind raised, handled as below
                else:  # not sent ahead, or still queued behind other gangs': bound here
                    self._bind(pod, b.node, annotations)
            except ReservationFailed as e:
                self._give_up(pod, e)
                dropped.append(b.pod)  # out of the intent: Pending again, room released
                continue
            except Fenced:
                break  # the lease ran out meanwhile: as above
            except Exception as e:
                if isinstance(e, ApiException) and e.status in (404, 409):
                    # deleted, or bound already
                    log.info("bind %s -> %s: %s %s", key, b.node, e.status, e.reason)
                    (dropped if e.status == 404 else bound).append(b.pod)
                    continue
                if is_transient(e):
                    self._retry_later(pod, b, describe_error(e))
                elif self._bind_refused(pod, b, describe_error(e)) and intent:
                    # given up: the transaction is rolled back (what it bound is evicted,
                    # the rest goes back to Pending with this pod)
                    drain()
                    self._gang_given_up([r for r in binds[i + 1:] if r.pod not in bound],
                                        pods, b)
                    self._settle_intent(pg, bound, dropped, started if done else {})
                    self._roll_back(pg, pods, f"the bind of {b.pod} was refused "
                                    f"{self.config.bind_attempts} times")
                    return done
                break
            bound.append(b.pod)
            done += 1
            self._note_bound(b, pod)
            if i == 0 and intent:
                self._send_ahead(binds, pods, annotations, ahead)
        drain()
        if (bound or dropped) and intent:
            self._settle_intent(pg, bound, dropped, started if done else {})
        return done

    def _note_bound(self, b: Bind, pod: Obj) -> None:
        key = f"{b.namespace}/{b.pod}"
        self._attempts.pop(key, None)
        self._retry_at.pop(key, None)
        with self._count_lock:
            self.bound_total += 1
            self._bound_now.append(b)
        self.events.emit(pod, "Scheduled",
                         f"Successfully assigned {b.namespace}/{b.pod} to {b.node}")

    def _send_ahead(self, binds: list[Bind], pods: dict[str, Obj],
                    annotations: Mapping[str, str] | None,
                    ahead: dict[int, Future[None]]) -> None:
        """Once a gang's first bind went through: send the binds of its later pods together
        (`gang_bind_workers` at a time) rather than each after the last one's answer, which
        most of a gang's bind time was spent waiting for. Only plain binds are sent: a pod
        gone, bound, backing off or sharing a GPU (its reservation first) waits its turn, and
        nothing is sent with too little leadership left."""
        if self.config.gang_bind_workers <= 1 or self.fence() < MIN_LEASE_LEFT_S:
            return
        now = time.monotonic()
        for j, b in enumerate(binds[1:], start=1):
            key = f"{b.namespace}/{b.pod}"
            pod = pods.get(key)
            if pod is None or b.gpu_groups or (pod.get("metadata") or {}).get(
                    "deletionTimestamp") or (pod.get("spec") or {}).get("nodeName") \
                    or now < self._retry_at.get(key, (0.0, 0))[0]:
                continue
            ahead[j] = self.gang_pool.submit(self._bind, pod, b.node, annotations)

    def _retry_later(self, pod: Obj, b: Bind, failure: str) -> None:
        """A transient fault (a reset, a timeout, 429, 5xx): the pod keeps its place in the
        intent and is tried again after a doubling back-off, as long as the fault lasts."""
        key = f"{b.namespace}/{b.pod}"
        faults = self._retry_at.get(key, (0.0, 0))[1] + 1
        first, cap = self.config.retry_s
        delay = min(cap, first * 2 ** (faults - 1))
        self._retry_at[key] = (time.monotonic() + delay, faults)
        log.warning("bind %s -> %s: transient fault %d (%s); tried again in %.0fs", key,
                    b.node, faults, failure, delay)
        self.events.emit(pod, "BindRetrying", f"binding to node {b.node} failed for a "
                         f"reason that may pass ({failure}); the pod keeps its place and is "
                         "tried again", type_="Warning")

    def _bind_refused(self, pod: Obj, b: Bind, failure: str) -> bool:
        """Count a refused bind of `pod`; True when it was refused `bind_attempts` times: it
        gets a BindFailed event and PodScheduled condition, and is listed in `gave_up`."""
        key = f"{b.namespace}/{b.pod}"
        tries = self._attempts.get(key, 0) + 1
        limit = max(1, self.config.bind_attempts)
        log.warning("bind %s -> %s refused (try %d of %d): %s", key, b.node, tries, limit,
                    failure)
        if tries < limit:
            self._attempts[key] = tries
            return False
        self._attempts.pop(key, None)
        self._not_bound(pod, f"binding to node {b.node} was refused {tries} times, last: "
                        f"{failure}; the pod is back to Pending and is tried again after a "
                        "back-off")
        return True

    def _gang_given_up(self, rest: list[Bind], pods: dict[str, Obj], failed: Bind) -> None:
        """The gang's unbound pods after `failed` go back to Pending with it, and back off
        with it: each is told why."""
        for r in rest:
            pod = pods.get(f"{r.namespace}/{r.pod}")
            if pod is None or (pod.get("spec") or {}).get("nodeName"):
                continue
            self._attempts.pop(f"{r.namespace}/{r.pod}", None)
            self._not_bound(pod, f"the bind of {failed.pod}, a pod of the same gang, was "
                            "refused for good; this pod is back to Pending with it and is "
                            "tried again after a back-off")

    def _roll_back(self, pg: Obj, pods: dict[str, Obj], why: str) -> None:
        """End the gang's transaction without it whole: the pods it bound are evicted (no pod
        of a gang left bound by a transaction that failed), those not bound lose the GPU-group
        labels and ConfigMap it gave them and go back to Pending with a back-off; an event on
        the PodGroup says why. Whether a pod is bound is read from the API server, not the
        watch cache (a bind that timed out may have landed). Until every bound pod is evicted
        the intent stays, its entries marked `rollback`, and each cycle goes on with it (a
        disruption budget refusing now, a fault, a lost lease): never a gang left half bound
        with no transaction."""
        m = pg["metadata"]
        ns = m["namespace"]
        intent = convert.bind_intent(pg)
        log.warning("PodGroup %s/%s: rolling back its binds: %s", ns, m["name"], why)
        with self._count_lock:  # bound by this call: `pods` (read before it) says Pending
            just_bound = {(b.namespace, b.pod) for b in self._bound_now}
        left: dict[str, Any] = {}
        for name, entry in intent.items():
            pod = pods.get(f"{ns}/{name}")
            if not is_member(pg, pod, entry) or (pod or {}).get("metadata", {}).get(
                    "deletionTimestamp"):
                continue  # only pods of this gang, as decided, are ever evicted
            assert pod is not None
            bound = (pod.get("spec") or {}).get("nodeName") or (ns, name) in just_bound or (
                isinstance(entry, dict) and entry.get("bound")) or self._bound_now_on_server(
                pod)
            if bound is None:  # could not tell: asked again next cycle
                left[name] = {**entry, "rollback": why}
            elif bound:
                if self._evict(pod, f"rolled back: {why}", "rollback") == "not now":
                    left[name] = {**entry, "bound": True, "rollback": why}
            else:
                self._undo_shared_gpu(pod)
                if f"{ns}/{name}" not in self.gave_up:
                    self._not_bound(pod, f"{why}; the gang's binds were rolled back and it "
                                    "is scheduled again after a back-off")
        self._write_intent_value(pg, json.dumps(left) if left else None, {})
        self.events.emit(pg, "BindRolledBack", f"binds rolled back: {why}" + (
            f" ({len(left)} pod(s) not evicted yet: tried again)" if left else ""),
            kind="PodGroup", api_version=PODGROUP.api_version, type_="Warning")

    def _bound_now_on_server(self, pod: Obj) -> bool | None:
        """Whether the API server has `pod` bound (None: it could not be asked)."""
        m = pod["metadata"]
        try:
            fresh = rawapi.request_json(
                self.api, "GET", f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}",
                timeout=self.write_timeout())
        except ApiException as e:
            return False if e.status == 404 else None
        except Exception:  # a fault, or fenced
            return None
        same = (fresh.get("metadata") or {}).get("uid") == m.get("uid")
        return bool(same and (fresh.get("spec") or {}).get("nodeName"))

    def _undo_shared_gpu(self, pod: Obj) -> None:
        """Remove what `_prepare_shared_gpu` gave a pod that was not bound: its GPU-group
        labels (they would keep the reservation pod alive) and its ConfigMap."""
        m = pod["metadata"]
        labels = {k: None for k in (m.get("labels") or {})
                  if k == GPU_GROUP_LABEL or k.startswith(GPU_GROUP_LABEL + "/")}
        try:
            if labels:
                self.core.patch_namespaced_pod(m["name"], m["namespace"],
                                               {"metadata": {"labels": labels}})
                # named as _prepare_shared_gpu names it (a prefix it set when none was there)
                ann = {CONFIGMAP_ANNOTATION: _configmap_prefix(pod), **(m.get("annotations")
                                                                       or {})}
                cm = admission.gpu_configmap({**pod, "metadata": {**m, "annotations": ann}},
                                             {})["metadata"]["name"]
                self.core.delete_namespaced_config_map(cm, m["namespace"])
        except Exception as e:  # best effort: the labels go with the next bind's anyway
            if getattr(e, "status", None) != 404:
                log.warning("pod %s/%s: shared-GPU set-up not undone: %s", m["namespace"],
                            m["name"], describe_error(e))

    def _not_bound(self, pod: Obj, message: str) -> None:
        m = pod["metadata"]
        self.gave_up[f"{m['namespace']}/{m['name']}"] = message
        self.events.emit(pod, "BindFailed", message, type_="Warning")
        try:
            self._not_scheduled(pod, "BindFailed", message)
        except Exception as e:  # the event says it; the next give-up writes it again
            log.warning("pod %s/%s: condition not written: %s", m["namespace"], m["name"],
                        describe_error(e))

    def _settle_intent(self, pg: Obj, bound: Iterable[str], dropped: Iterable[str],
                       extra: Mapping[str, str] | None) -> None:
        """Record in the gang's intent the pods now `bound` (kept, marked, until the whole
        transaction is: a rollback evicts them) and take `dropped` ones out; once every entry
        left is bound the intent is removed. `extra` annotations are written with it."""
        pending = convert.bind_intent(pg)
        for name in dropped:
            pending.pop(name, None)
        for name in bound:
            if isinstance(pending.get(name), dict):
                pending[name]["bound"] = True
        if extra and api_names.LAST_START_ANNOTATION in extra:
            for v in pending.values():  # stamped once: later binds must not move the start
                if isinstance(v, dict):
                    v.pop("start", None)
        whole = all(isinstance(v, dict) and v.get("bound") for v in pending.values())
        self._write_intent_value(pg, None if whole else json.dumps(pending), extra)

    def _write_intent_value(self, pg: Obj, value: str | None,
                            extra: Mapping[str, str] | None) -> None:
        update: dict[str, str | None] = {api_names.BIND_INTENT_ANNOTATION: value}
        update.update(extra or {})
        try:
            self._patch_pg_annotations(pg, update)
        except Exception as e:  # the next cycle's resume() sees the rest
            log.warning("PodGroup %s: intent not updated (%s)", pg["metadata"]["name"],
                        getattr(e, "status", None) or f"{type(e).__name__}: {e}")
            return
        # a later write of this cycle (new binds of the gang) starts from this
        ann = pg["metadata"].setdefault("annotations", {})
        for k, v in update.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v

    def _bind(self, pod: Obj, node: str, annotations: Mapping[str, str] | None = None) -> None:
        m = pod["metadata"]
        rawapi.bind(self.bind_api, m["namespace"], m["name"], m.get("uid"), node,
                    timeout=self.write_timeout(), annotations=annotations)

    def _not_scheduled(self, pod: Obj, reason: str, message: str) -> None:
        not_scheduled(self.api, pod, reason, message)

    def _post_eviction(self, pod: Obj, timeout: tuple[float, float] | None) -> None:
        # a plain request: CoreV1Api's first use imports every core model (over a second
        # here when a waiting gang's condition was its first user; docs/reliability.md)
        m = pod["metadata"]
        rawapi.evict(self.api, m["namespace"], m["name"], timeout)

    # ------------------------------------------------------------------ GPU sharing
    def _ensure_reservation_access(self) -> None:
        """The reservation namespace, and the ServiceAccount its pods report with (allowed to
        patch pods there, nothing else). The chart creates them and grants the scheduler none
        of these writes, only a read of the account: found, nothing is written."""
        if self.reservation_ns_ready:
            return
        ns = self.config.reservation_namespace
        sa = self.config.reservation_service_account
        try:
            self.core.read_namespaced_service_account(sa, ns)
            self.reservation_ns_ready = True
            return
        except ApiException as e:
            if e.status not in (403, 404):
                raise
        role = {"metadata": {"name": sa, "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]}
        binding = {"metadata": {"name": sa, "namespace": ns},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": sa},
                   "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
        rbac = client.RbacAuthorizationV1Api(self.api)
        creates = [
            lambda: self.core.create_namespace({"metadata": {"name": ns, "labels": PSS_LABELS}}),
            lambda: self.core.create_namespaced_service_account(
                ns, {"metadata": {"name": sa, "namespace": ns}}),
            lambda: rbac.create_namespaced_role(ns, role),
            lambda: rbac.create_namespaced_role_binding(ns, binding),
        ]
        forbidden = False
        for create in creates:
            try:
                create()
            except ApiException as e:
                if e.status == 403:
                    forbidden = True
                elif e.status != 409:
                    raise
        if forbidden:  # installed by the chart? The pods cannot report without the account
            try:
                self.core.read_namespaced_service_account(sa, ns)
            except ApiException as e:
                log.error("reservation pods need ServiceAccount %s/%s (patch on pods in %s), "
                          "which is missing (%s) and kai-ray may not create it: install the "
                          "chart, or create it as docs/gpu-sharing.md shows", ns, sa, ns,
                          e.status)
        self.reservation_ns_ready = True

    @staticmethod
    def reservation_name(node: str, group: str) -> str:
        """Unique per (node, group) whatever their length (group ids repeat the node's name, so
        a plain join cut to 63 characters can give two devices one name); readable prefix."""
        digest = hashlib.sha256(f"{node}/{group}".encode()).hexdigest()[:12]
        return f"gpu-reservation-{node[:30].rstrip('-.')}-{digest}".lower()

    def _reservation(self, node: str, group: str, pods: dict[str, Obj]) -> Obj | None:
        """The live reservation pod of `group` on `node`, found by label as KAI labels it
        (so one KAI created is found too), from the pods this call was given."""
        if self._reservations is None:
            index: dict[tuple[str, str], Obj] = {}
            prefix = f"{self.config.reservation_namespace}/"
            for key, p in pods.items():
                m = p.get("metadata") or {}
                g = (m.get("labels") or {}).get(api_names.GPU_GROUP_LABEL)
                if key.startswith(prefix) and g and not m.get("deletionTimestamp"):
                    index[((p.get("spec") or {}).get("nodeName") or "", g)] = p
            self._reservations = index
        return self._reservations.get((node, group))

    def _create_reservation(self, node: str, group: str) -> None:
        self._ensure_reservation_access()
        name = self.reservation_name(node, group)
        field_env = [{"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                     for var, path in (("POD_NAME", "metadata.name"),
                                       ("POD_NAMESPACE", "metadata.namespace"))]
        body = {
            "metadata": {"name": name, "namespace": self.config.reservation_namespace,
                         "labels": {"app": RESERVATION_APP, api_names.GPU_GROUP_LABEL: group},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {
                "nodeName": node, "restartPolicy": "Never",
                "serviceAccountName": self.config.reservation_service_account,
                "automountServiceAccountToken": True,
                "terminationGracePeriodSeconds": 5,
                "tolerations": [{"operator": "Exists"}],
                # the "restricted" Pod Security Standard (the namespace enforces it)
                "securityContext": {"runAsNonRoot": True, "runAsUser": RESERVATION_UID,
                                    "runAsGroup": RESERVATION_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "reservation", "image": self.config.reservation_image,
                    "imagePullPolicy": "IfNotPresent", "env": field_env,
                    # Guaranteed QoS: the last pod the kubelet would evict or OOM-kill
                    "resources": {"limits": {convert.GPU: "1", "cpu": "10m", "memory": "64Mi"},
                                  "requests": {convert.GPU: "1", "cpu": "10m",
                                               "memory": "64Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}}]},
        }
        try:
            self.core.create_namespaced_pod(self.config.reservation_namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise

    def _reserved_devices(self, pod: Obj, b: Bind, pods: dict[str, Obj]) -> list[str] | None:
        """The physical GPU ids the reservation pods of `b`'s groups reported, or None while
        one has not yet (it is created if missing); raises ReservationFailed when one failed
        or its time is up."""
        devices: list[str] = []
        waiting: list[str] = []
        for group in b.gpu_groups:
            res = self._reservation(b.node, group, pods)
            if res is None:
                waiting.append(self._create_or_wait(b.node, group))
                continue
            device = (res["metadata"].get("annotations") or {}).get(GPU_INDEX_ANNOTATION)
            phase = (res.get("status") or {}).get("phase")
            if device and phase not in ("Failed", "Succeeded"):
                self._waiting_since.pop(res["metadata"]["name"], None)
                devices.append(str(device))
                continue
            waiting.append(self._check_reservation(res))
        if not waiting:
            return devices
        self.events.emit(pod, "WaitingForGPUReservation",
                         f"waiting for GPU reservation pod {self.config.reservation_namespace}/"
                         f"{'; '.join(waiting)} to report its device (annotation "
                         f"{GPU_INDEX_ANNOTATION}) before binding to {b.node}")
        return None

    def _create_or_wait(self, node: str, group: str) -> str:
        """Create the reservation pod (again); a refusal (a quota, a policy, the namespace
        gone) is waited on like a silent pod, and fails the waiting pods at the deadline."""
        name = self.reservation_name(node, group)
        since = self._waiting_since.setdefault(name, time.monotonic())
        try:
            self._create_reservation(node, group)
        except ApiException as e:
            refused = f"creating it was refused: {e.status} {e.reason}"
            if time.monotonic() - since > self.config.reservation_timeout_s:
                raise ReservationFailed(name, "GPU reservation pod "
                                        f"{self.config.reservation_namespace}/{name} "
                                        "could not be created within "
                                        f"{self.config.reservation_timeout_s:.0f}s: {refused}"
                                        ) from None
            return f"{name} ({refused})"
        return f"{name} (just created)"

    def _check_reservation(self, res: Obj) -> str:
        """How a reservation pod that has not reported is doing; raises ReservationFailed when
        it ended or waited past the deadline (counted from when this binder first saw it)."""
        m = res["metadata"]
        status = res.get("status") or {}
        state = ""
        for cs in status.get("containerStatuses") or []:
            for kind in ("terminated", "waiting"):
                detail = (cs.get("state") or {}).get(kind)
                if detail:
                    state = ": ".join(x for x in (detail.get("reason"), detail.get("message"))
                                      if x)
        where = f"{self.config.reservation_namespace}/{m['name']}"
        if status.get("phase") in ("Failed", "Succeeded"):
            raise ReservationFailed(m["name"], f"GPU reservation pod {where} ended "
                                    f"({status.get('phase')}) without reporting its device"
                                    f"{': ' + state if state else ''}")
        since = self._waiting_since.setdefault(m["name"], time.monotonic())
        waited = time.monotonic() - since
        if waited > self.config.reservation_timeout_s:
            raise ReservationFailed(
                m["name"], f"GPU reservation pod {where} did not report its device (annotation "
                f"{GPU_INDEX_ANNOTATION}) within {self.config.reservation_timeout_s:.0f}s"
                f"{' (' + state + ')' if state else ''}; is kai-ray's reservation image "
                f"({self.config.reservation_image}) runnable on the node, and does the node "
                "run a GPU device plugin?")
        # no elapsed time in it: the event is written again only when the state changes
        return f"{m['name']} ({status.get('phase') or 'Pending'}{', ' + state if state else ''})"

    def _give_up(self, pod: Obj, failure: ReservationFailed) -> None:
        """Delete the failed reservation pod and tell the pod that waited for it."""
        self._waiting_since.pop(failure.pod_name, None)  # a new attempt gets its own time
        try:
            self.core.delete_namespaced_pod(failure.pod_name, self.config.reservation_namespace)
        except ApiException as e:
            if e.status != 404:
                log.warning("reservation pod %s not deleted: %s", failure.pod_name, e.status)
        except Exception as e:  # the next clean-up deletes it
            log.warning("reservation pod %s not deleted: %s", failure.pod_name,
                        describe_error(e))
        m = pod["metadata"]
        message = f"{failure}; the pod goes back to Pending and is scheduled again"
        log.warning("pod %s/%s: %s", m["namespace"], m["name"], message)
        self.events.emit(pod, "GPUReservationFailed", message, type_="Warning")
        try:
            self._not_scheduled(pod, "GPUReservationFailed", message)
        except Exception as e:  # the event says it already
            log.warning("pod %s/%s: condition not written: %s", m["namespace"], m["name"],
                        describe_error(e))

    def _prepare_shared_gpu(self, pod: Obj, b: Bind, devices: list[str]) -> None:
        m = pod["metadata"]
        labels: dict[str, str] = {}
        if len(b.gpu_groups) == 1:
            labels[api_names.GPU_GROUP_LABEL] = b.gpu_groups[0]
        else:
            labels.update({f"{api_names.GPU_GROUP_LABEL}/{g}": g for g in b.gpu_groups})
        ann = m.get("annotations") or {}
        patch: dict[str, Any] = {"metadata": {"labels": labels}}
        if CONFIGMAP_ANNOTATION not in ann:
            # admitted without our webhook: still record where the env lives
            prefix = _configmap_prefix(pod)
            patch["metadata"]["annotations"] = {CONFIGMAP_ANNOTATION: prefix}
            ann = {**ann, CONFIGMAP_ANNOTATION: prefix}
        if m.get("resourceVersion"):
            # only over the pod as read (unbound): never relabel, nor then rewrite the
            # ConfigMap of, a pod another replica bound meanwhile to another device
            patch["metadata"]["resourceVersion"] = m["resourceVersion"]
        try:
            self.core.patch_namespaced_pod(m["name"], m["namespace"], patch,
                                           _request_timeout=self.write_timeout())
        except ApiException as e:
            if e.status == 409:
                raise StaleRead(f"pod {m['namespace']}/{m['name']} changed since it was "
                                "read; tried again on the next cycle's view") from e
            raise
        memory = b.gpu_memory_mib or None
        data = admission.gpu_configmap_data(devices, b.gpu_portion or 1.0, memory)
        cm = admission.gpu_configmap({**pod, "metadata": {**m, "annotations": ann}}, data)
        try:
            self.core.create_namespaced_config_map(m["namespace"], cm)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.replace_namespaced_config_map(cm["metadata"]["name"], m["namespace"], cm)

    def collect_reservations(self, pods: Iterable[Obj], podgroups: Iterable[Obj] = (),
                             assumed_groups: Iterable[str] = ()) -> int:
        """Delete reservation pods whose device no pod shares any more. A device counts as
        shared by running pods (their group labels), by pods still waiting in a bind intent
        for their reservation pod to report, and by pods just bound (`assumed_groups`: the
        watch may not show their labels yet)."""
        pods = list(pods)
        reservations = [pod for pod in pods if _is_reservation(pod, self.config)]
        # forget clocks of reservation pods long gone (a just-created one may not show yet)
        seen = {r["metadata"]["name"] for r in reservations}
        stale = time.monotonic() - 2 * self.config.reservation_timeout_s
        for name, since in list(self._waiting_since.items()):
            if name not in seen and since < stale:
                del self._waiting_since[name]
        if not reservations:
            return 0  # nothing to collect: the devices in use need not be worked out
        in_use: set[str] = set(assumed_groups)
        for pg in podgroups:
            for entry in convert.bind_intent(pg).values():
                groups = entry.get("gpu_groups") if isinstance(entry, dict) else None
                if isinstance(groups, list):  # a hand-edited entry counts for nothing
                    in_use.update(str(g) for g in groups)
        for pod in pods:
            m = pod.get("metadata") or {}
            if m.get("namespace") == self.config.reservation_namespace:
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                continue
            in_use.update(convert.gpu_groups(pod))
        removed = 0
        for r in reservations:
            group = (r["metadata"].get("labels") or {}).get(api_names.GPU_GROUP_LABEL)
            if group in in_use or r["metadata"].get("deletionTimestamp"):
                continue
            try:
                self.core.delete_namespaced_pod(r["metadata"]["name"],
                                                self.config.reservation_namespace)
                removed += 1
            except ApiException as e:
                if e.status != 404:
                    log.warning("reservation pod %s not deleted: %s", r["metadata"]["name"],
                                e.status)
        return removed

    # ------------------------------------------------------------------ evictions
    def evict(self, pod: Obj, message: str, action: str) -> bool:
        """Evict `pod`; True when the eviction was accepted."""
        return self._evict(pod, message, action) == "evicted"

    def _evict(self, pod: Obj, message: str, action: str) -> str:
        """"evicted", "gone" (404) or "not now" (refused, fenced, a fault: decided again)."""
        try:
            self._post_eviction(pod, self.write_timeout())
        except Fenced:
            return "not now"  # whoever leads next decides again
        except ApiException as e:
            if e.status == 404:
                return "gone"
            # 429: a disruption budget says not now; 500: more than one budget covers the pod
            # (the eviction API refuses to choose). The next cycle decides again.
            self._eviction_refused(pod, f"{e.status} {e.reason}: {api_message(e)}")
            return "not now"
        except Exception as e:  # a reset or a timeout: this victim's outcome
            self._eviction_refused(pod, f"{type(e).__name__}: {e}")
            return "not now"
        reason = {"stalegangeviction": "Evicted", "rollback": "BindRolledBack"}.get(
            action, "Preempted")
        self.events.emit(pod, reason, message, dedupe=False)
        return "evicted"


    def _eviction_refused(self, pod: Obj, why: str) -> None:
        m = pod["metadata"]
        log.info("eviction of %s/%s refused: %s", m["namespace"], m["name"], why)
        self.events.emit(pod, "EvictionRefused", f"the scheduler's eviction of this pod was "
                         f"refused ({why}); it keeps running and the scheduler decides again "
                         "next cycle", type_="Warning")


def api_message(e: ApiException) -> str:
    """The `message` of an API error's Status body (what a policy or webhook said), else its
    body cut short."""
    body = e.body if isinstance(e.body, str) else ""
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message or body[:300] or e.reason or "")


# HTTP statuses of a bind that a retry may get past: too many requests, a server fault, or
# no answer at all (0: the client raised before a status came back)
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
# refusals that repeat however often they are tried, even when the API server says 500
# (a webhook that answered "no")
_DENIALS = ("denied the request", "ValidatingAdmissionPolicy", "is forbidden")


def is_transient(e: BaseException) -> bool:
    """Whether a failed request may succeed when tried again: a reset, a timeout, 429 or
    5xx. A refusal (400, 403, 422, a webhook or policy denial) or a bad value is not."""
    if isinstance(e, ApiException):
        return e.status in TRANSIENT_STATUSES and not any(
            d in api_message(e) for d in _DENIALS)
    return isinstance(e, urllib3.exceptions.HTTPError | OSError | TimeoutError | StaleRead)


def describe_error(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}: {api_message(e)}"
    return f"{type(e).__name__}: {e}"


def is_member(pg: Obj, pod: Obj | None, entry: Any) -> bool:
    """Whether `pod` is one the PodGroup's intent `entry` may act on: a pod of our scheduler,
    of this gang (its pod-group-name annotation), the very pod decided on (the uid the entry
    names, when it names one). An intent never binds or evicts any other pod."""
    if pod is None or not convert.is_ours(pod):
        return False
    m = pod.get("metadata") or {}
    if (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION) != pg["metadata"]["name"]:
        return False
    uid = entry.get("uid") if isinstance(entry, dict) else None
    return not uid or uid == m.get("uid")


def _intent_bind(job: str, namespace: str, name: str, v: Any) -> Bind | None:
    """A Bind from one bind-intent entry; None when the entry cannot be read."""
    if not isinstance(v, dict) or not isinstance(v.get("node"), str) or not v["node"]:
        return None
    if not all(isinstance(v.get(k) or [], list) for k in ("gpu_groups", "new_gpu_groups")):
        return None  # a string would be read as one group per character
    try:
        return Bind(job=job, namespace=namespace, pod=name, node=v["node"],
                    gpu_groups=tuple(str(g) for g in v.get("gpu_groups") or ()),
                    new_gpu_groups=tuple(str(g) for g in v.get("new_gpu_groups") or ()),
                    gpu_portion=float(v.get("portion") or 0.0),
                    gpu_memory_mib=int(v.get("memory_mib") or 0), action="resume")
    except (TypeError, ValueError):
        return None


def _configmap_prefix(pod: Obj) -> str:
    """The shared-GPU ConfigMap prefix the binder gives a pod admitted without our webhook."""
    return f"{pod['metadata']['name'][:40]}-shared-gpu"


def last_start_needed(pg: Obj) -> bool:
    return api_names.LAST_START_ANNOTATION not in (pg["metadata"].get("annotations") or {})


def stamp() -> str:
    return convert.now_rfc3339()
