"""The scheduling loop: every period, group new pods, take a snapshot from the watch cache,
run the pure core, and carry the decisions out (binder, status, events)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from kai_ray.api_names import PODGROUP, QUEUE
from kai_ray.controller import logsetup
from kai_ray.controller.plan import (
    BACKOFF_SECONDS,
    BackOff,
    CyclePlan,
    backoff_seconds,
    plan_cycle,
)
from kai_ray.core.model import ACTIVE_ALLOCATED, PodStatus, SchedulerConfig, Snapshot
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import describe_core, schedule
from kai_ray.k8s.binder import Binder, BinderConfig
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.fencing import MIN_LEASE_LEFT_S
from kai_ray.k8s.provisional import WRITE, is_provisional
from kai_ray.k8s.status import StatusWriter
from kai_ray.k8s.suspend import Suspender

log = logging.getLogger(__name__)
Obj = dict[str, Any]
ASSUME_SECONDS = 30.0
# the API version events name for each kind a Problem can be about
PROBLEM_KINDS = {"Pod": "v1", "Node": "v1", "PriorityClass": "scheduling.k8s.io/v1",
                 PODGROUP.kind: PODGROUP.api_version, QUEUE.kind: QUEUE.api_version}


@dataclass
class LoopConfig:
    period_s: float = 1.0
    # new work starts the next cycle early: as soon as it makes a gang whole, else this long
    # after it arrived (what comes with it, a gang's next pods, is read in the same cycle)
    min_period_s: float = 0.1
    # a leader's first cycle waits (at most this long) for the pod grouper's first pass: the
    # pods pending at start are then decided in one cycle, instead of the gangs whose PodGroups
    # exist first and everything else only after that cycle's whole bind phase
    first_grouping_wait_s: float = 5.0
    core: SchedulerConfig = field(default_factory=SchedulerConfig)
    binder: BinderConfig = field(default_factory=BinderConfig)
    reservation_gc: bool = True


@dataclass
class _Assumed:
    """A decision already sent that the watch cache may not show yet (kube-scheduler's assume
    cache): a bound pod still looks Pending for a few milliseconds, an evicted one still
    Running. Without this the next cycle could decide for those pods again."""

    status: PodStatus
    node: str | None
    groups: tuple[str, ...]
    until: float


@dataclass
class Writers:
    """What the loop writes a cycle's plan with: binds and evictions, status and events, RayJob
    suspension. Made on the API clients unless the loop is handed others (fakes, in tests)."""

    binder: Binder
    status: StatusWriter
    suspender: Suspender

    @classmethod
    def on(cls, api: client.ApiClient, events: EventRecorder, config: BinderConfig,
           bind_api: client.ApiClient | None = None) -> Writers:
        return cls(Binder(api, events, config, bind_api=bind_api), StatusWriter(api, events),
                   Suspender(api, events))


class SchedulerLoop:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, config: LoopConfig,
                 grouper: Any = None, on_cycle: Any = None,
                 events_api: client.ApiClient | None = None,
                 bind_api: client.ApiClient | None = None,
                 writers: Writers | None = None) -> None:
        self.cache = cache
        self.config = config
        self.events = EventRecorder(events_api or api)
        if writers is None:
            writers = Writers.on(api, self.events, config.binder, bind_api)
        self.binder, self.status, self.suspender = (writers.binder, writers.status,
                                                    writers.suspender)
        self.grouper = grouper
        self.on_cycle = on_cycle
        self.assumed: dict[str, _Assumed] = {}
        # pods whose bind was given up: key -> (not before (monotonic), give-ups so far)
        self.backoff: dict[str, tuple[float, int]] = {}
        self._backoff_why: dict[str, str] = {}  # key -> the binder's last give-up message
        self._problems: set[str] = set()  # last cycle's, so each is logged once
        self.cycles = 0
        self.failed_cycles = 0
        # monotonic times the health endpoint reads: the start of the cycle running now (None
        # between cycles) and the last time the loop made progress (a cycle completed, or a
        # follower's turn to wait)
        self.cycle_started: float | None = None
        self.last_progress = time.monotonic()
        self.last_error: str | None = None
        self.last_result: CycleResult | None = None
        self.stopping = threading.Event()
        self._grouping: threading.Thread | None = None
        self._grouped = threading.Event()  # a grouper pass ran (as leader) since it was cleared
        # seconds this replica surely leads (the elector's lease_left; no election: forever):
        # each step of a cycle, and each bind and eviction, writes only with time left
        self.lease_left: Callable[[], float] = lambda: math.inf
        # times this replica became leader (the elector's `transitions`): a cycle decided
        # under one leadership writes nothing once another began (lost and won back meanwhile,
        # another leader may have bound in between)
        self.leader_epoch: Callable[[], int] = lambda: 0
        self._cycle_epoch = 0
        self.binder.fence = self.fence
        self.binder.provisional = getattr(cache, "provisional", None)

    def fence(self) -> float:
        """Seconds of writing left: none once stopping (SIGTERM: the lease is released only
        after the loop stopped) or once the leadership the cycle began under ended, else the
        lease's."""
        if self.stopping.is_set() or self.leader_epoch() != self._cycle_epoch:
            return 0.0
        return self.lease_left()

    # ------------------------------------------------------------------ snapshot
    def _apply_assumed(self, snapshot: Snapshot, pods: dict[str, Obj]) -> Snapshot:
        now = time.monotonic()
        for key, (until, _) in list(self.backoff.items()):
            pod = pods.get(key)
            if pod is None or (pod.get("spec") or {}).get("nodeName") or (
                    now > until + BACKOFF_SECONDS[1]):
                del self.backoff[key]  # gone, bound meanwhile, or long past: forget it
                self._backoff_why.pop(key, None)
        for key, a in list(self.assumed.items()):
            pod = pods.get(key)
            seen = pod is not None and (
                (a.status == PodStatus.BOUND and (pod.get("spec") or {}).get("nodeName"))
                or (a.status == PodStatus.RELEASING and
                    (pod.get("metadata") or {}).get("deletionTimestamp")))
            if pod is None or seen or now > a.until:
                del self.assumed[key]
        waiting = {k for k, (until, _) in self.backoff.items() if now < until}
        if not self.assumed and not waiting:
            return snapshot
        jobs = []
        for job in snapshot.jobs:
            changed = False
            new_pods = []
            for p in job.pods:
                key = f"{p.namespace}/{p.name}"
                sent = self.assumed.get(key)
                if sent is not None and p.status in (PodStatus.PENDING, *ACTIVE_ALLOCATED):
                    p = dataclasses.replace(p, status=sent.status, node=sent.node or p.node,
                                            gpu_groups=sent.groups or p.gpu_groups)
                    changed = True
                elif key in waiting and p.status == PodStatus.PENDING:
                    # backing off after its bind failed for good: not placed, as if gated
                    p = dataclasses.replace(p, status=PodStatus.GATED)
                    changed = True
                new_pods.append(p)
            jobs.append(dataclasses.replace(job, pods=tuple(new_pods)) if changed else job)
        return dataclasses.replace(snapshot, jobs=tuple(jobs))

    # ------------------------------------------------------------------ one cycle
    def cycle(self) -> CycleResult:
        start = time.perf_counter()  # pods are grouped by run()'s grouper thread
        pods = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": p
                for p in self.cache.pods.values()}
        snapshot, problems, podgroups = self.cache.snapshot()
        # binds a previous cycle (or a crashed run) recorded but did not finish
        if any(convert_intent(pg) for pg in podgroups.values()):
            # re-checked before each gang goes on: a node it binds to must still exist
            self.binder.nodes = {n["metadata"]["name"]: n for n in self.cache.nodes.values()}
            self.binder.resume(podgroups.values(), pods)
            until = time.monotonic() + ASSUME_SECONDS
            for b in self.binder.resumed:  # as for the cycle's own binds (_carry_out)
                self.assumed[f"{b.namespace}/{b.pod}"] = _Assumed(PodStatus.BOUND, b.node,
                                                                  b.gpu_groups, until)
            self._back_off(self.binder.gave_up)
        snapshot = self._apply_assumed(snapshot, pods)
        t_snap = time.perf_counter()
        decided = schedule(snapshot, self.config.core, time.time(), clock=time.perf_counter)
        t_core = time.perf_counter()
        plan = plan_cycle(decided, snapshot, podgroups, pods,
                          BackOff(self.backoff, self._backoff_why), time.monotonic())
        result = plan.result
        if not self.cycles:  # how long start-up took, the interpreter and imports included
            log.info("first cycle decided: %d binds, %d evictions%s", len(result.binds),
                     len(result.evictions), logsetup.age_note())
        self._carry_out(plan, podgroups, pods, problems)
        self.cycles += 1
        self.last_result = result
        end = time.perf_counter()
        result.action_seconds["cycle"] = end - start
        if result.binds or result.evictions:
            log.info("cycle %d: snapshot of %d jobs (%.2fs), core %.2fs, %d binds / %d "
                     "evictions / %d pending jobs applied in %.2fs",
                     self.cycles, len(snapshot.jobs), t_snap - start,
                     t_core - t_snap, len(result.binds), len(result.evictions),
                     len(result.job_status), end - t_core)
        else:  # an idle cycle: once a second, so only at --log-level debug
            log.debug("cycle %d: snapshot of %d jobs (%.2fs), core %.2fs, nothing to do, "
                      "%d pending jobs", self.cycles, len(snapshot.jobs), t_snap - start,
                      t_core - t_snap, len(result.job_status))
        if self.on_cycle is not None:
            self.on_cycle(result)
        return result

    def _carry_out(self, plan: CyclePlan, podgroups: dict[str, Obj], pods: dict[str, Obj],
                   problems: list[Any]) -> None:
        """The plan's writes, each step on its own: a fault in one (an API error, a reset, a
        bug) is logged and the others still run; the steps repeat what is left next cycle."""
        result = plan.result
        until = time.monotonic() + ASSUME_SECONDS
        suspended: set[str] = set()
        for s in plan.suspensions:
            if self._step("suspending a RayJob", False, self.suspender.suspend, s.podgroup,
                          list(s.pods), s.message):
                suspended |= s.pod_keys
        for key in suspended:
            self.assumed[key] = _Assumed(PodStatus.RELEASING, None, (), until)
        for pg in plan.resumptions:
            self._step("resuming a RayJob", None, self.suspender.resume, pg)
        for ev in result.evictions:
            if f"{ev.namespace}/{ev.pod}" in suspended:
                continue  # its RayJob was suspended instead
            pod = pods.get(f"{ev.namespace}/{ev.pod}")
            if pod is not None and self.binder.evict(pod, ev.message, ev.action):
                self.assumed[f"{ev.namespace}/{ev.pod}"] = _Assumed(
                    PodStatus.RELEASING, ev.node, (), until)
        # jobs that start now: the binder stamps their last-start time with their binds
        self.binder.apply_binds(result, podgroups, pods, set(plan.starting))
        # counted from the end of the binds: a bind phase of thousands of pods can outlast
        # ASSUME_SECONDS, and an assumption that expired before the watch showed its bind would
        # let the next cycle decide the same pod again (the API server refuses: 409)
        bound_until = time.monotonic() + ASSUME_SECONDS
        for b in result.binds:
            key = f"{b.namespace}/{b.pod}"
            if key in self.binder.last_bound:  # not one waiting for its GPU reservation pod
                self.assumed[key] = _Assumed(PodStatus.BOUND, b.node, b.gpu_groups, bound_until)
        self._back_off(self.binder.gave_up)
        self._step("pending status", None, self.status.pending, result, podgroups, pods)
        self._step("PodGroups of waiting bare pods", None, self._write_waiting_podgroups,
                   result, podgroups)
        self._step("scheduled status", None, self.status.clear_scheduled, podgroups.values(),
                   set(result.job_status))
        self._step("stale gangs", None, self.status.stale, result, podgroups)
        self._step("queue status", None, self.status.queues, result.queues,
                   self.cache.queues.values(), problems)
        self._report(problems)
        if self.config.reservation_gc:
            self._step("reservation clean-up", None, self.binder.collect_reservations,
                       pods.values(), podgroups.values(),
                       {g for a in self.assumed.values() if a.status == PodStatus.BOUND
                        for g in a.groups})

    def _write_waiting_podgroups(self, result: CycleResult, podgroups: dict[str, Obj]) -> None:
        """A bare pod scheduled before its PodGroup was written (kai_ray.k8s.provisional)
        that this cycle could not place gets its PodGroup now, which then carries why."""
        registry = self.binder.provisional
        if registry is None:
            return
        keys = [pod_key for job in result.job_status if is_provisional(podgroups.get(job))
                and (pod_key := registry.mark(job, WRITE))]
        if keys:
            self.cache.regroup(keys)

    def _step(self, what: str, default: Any, fn: Any, *args: Any) -> Any:
        if self.fence() < MIN_LEASE_LEFT_S:
            log.info("%s skipped: this replica may no longer lead", what)
            return default
        try:
            return fn(*args)
        except Exception:  # this step's outcome, not the cycle's
            log.exception("%s failed; the next cycle tries again", what)
            return default

    def _back_off(self, gave_up: dict[str, str]) -> None:
        """Pods whose bind was given up wait before they are scheduled again, longer each
        time (a policy that refuses a binding refuses it next cycle too)."""
        now = time.monotonic()
        for key in gave_up:
            _, count = self.backoff.get(key, (0.0, 0))
            delay = backoff_seconds(count + 1)
            self.backoff[key] = (now + delay, count + 1)
            self._backoff_why[key] = gave_up[key]
            log.info("pod %s: back-off %.0fs before it is scheduled again", key, delay)

    def _report(self, problems: list[Any]) -> None:
        """Each problem as a Warning event on its object (the recorder writes an unchanged
        one once); logged when it is new. Queue problems are also the Queue's condition."""
        seen = set()
        for problem in problems:
            text = str(problem)
            seen.add(text)
            if text not in self._problems:
                log.warning("%s", text)
            obj = {"metadata": {"name": problem.name, "namespace": problem.namespace,
                                "uid": problem.uid or None}}
            self.events.emit(obj, "InvalidSpec", f"{problem.field}: {problem.message}",
                             kind=problem.kind,
                             api_version=PROBLEM_KINDS.get(problem.kind, "v1"),
                             type_="Warning")
        self._problems = seen

    # ------------------------------------------------------------------ loop
    def _group_forever(self, is_leader: Any) -> None:
        """The pod grouper beside the cycles, not inside them: new pods get their PodGroups
        while the binder works, and a long bind phase does not hold back grouping."""
        assert self.grouper is not None
        wake = self.cache.pods_to_group  # set by pod events that can change grouping
        while not self.stopping.is_set():
            if is_leader is not None and not is_leader():
                self.stopping.wait(self.config.period_s)
                continue
            last = time.monotonic()
            try:
                handled = self.grouper.run_once()
            except Exception:  # one bad pass must not stop grouping
                log.exception("pod grouping failed")
            else:
                if not self._grouped.is_set():  # the pass the first cycle waits for
                    log.info("pod grouper: first pass, %d pods in %.2fs", handled,
                             time.monotonic() - last)
            self._grouped.set()
            # new or changed pods at once; otherwise a pass per cycle period (retries of failed
            # pods, owner resyncs), as often as when the grouper ran inside the cycle
            wake.wait(max(0.0, last + self.config.period_s - time.monotonic()))

    def run(self, is_leader: Any = None) -> None:
        log.info("scheduling core: %s", describe_core())
        if self.grouper is not None and (self._grouping is None
                                         or not self._grouping.is_alive()):
            # bare pods are placed before their PodGroups are written; once one is bound, its
            # PodGroup goes out on the grouper's client (kai_ray.k8s.provisional)
            self.grouper.defer_bare_pods = True
            self.binder.create_podgroup = self.grouper.create_after_bind
            self.binder.after_binds = self.grouper.flush_after_binds
            self._grouping = threading.Thread(target=self._group_forever, args=(is_leader,),
                                              name="pod-grouper", daemon=True)
            self._grouping.start()
        arrivals = getattr(self.cache, "arrivals", None)
        whole = self._gang_whole()
        leading = False
        while not self.stopping.is_set():
            started = time.monotonic()
            if arrivals is not None:
                arrivals.clear()  # what arrives from now on is not in this cycle's snapshot
            if whole is not None:
                whole.clear()
            if is_leader is None or is_leader():
                if not leading and self._grouping is not None:
                    self._first_grouping()
                    started = time.monotonic()
                leading = True
                self.cycle_started = started
                self._cycle_epoch = self.leader_epoch()
                try:
                    self.cycle()
                except Exception as e:  # one bad cycle must not stop scheduling
                    self.failed_cycles += 1
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.exception("scheduling cycle failed")
                else:
                    self.last_progress = time.monotonic()
                    self.last_error = None
                finally:
                    self.cycle_started = None
            else:
                leading = False
                self.last_progress = time.monotonic()  # a follower waits: that is its work
            self.cache.changed.clear()
            self._wait_for_next_cycle(started, arrivals, whole)

    def _gang_whole(self) -> threading.Event | None:
        gangs = getattr(self.cache, "gangs", None)
        return None if gangs is None else gangs.whole

    def _first_grouping(self) -> None:
        """Before the first cycle as leader: until the pod grouper has passed once as leader
        (bounded: a slow pass must not hold scheduling back)."""
        self._grouped.clear()
        if not self._grouped.wait(self.config.first_grouping_wait_s):
            log.info("first cycle without the pod grouper's first pass (not done after %.0fs)",
                     self.config.first_grouping_wait_s)

    def _wait_for_next_cycle(self, started: float, arrivals: threading.Event | None,
                             whole: threading.Event | None = None) -> None:
        """Until `period_s` after the cycle began, or, once new work arrived (a pending pod
        or a PodGroup created, pods grouped), until a gang is whole (`whole`: one has its
        minMember of pods, kai_ray.k8s.gang_arrivals) but at most `min_period_s` after the
        arrival: a new gang is placed within a fraction of a second, not at the next tick, and
        an arrival that completes no gang (a bare pod, a gang's first pods) pauses so that
        what comes with it is read in the same cycle."""
        deadline = started + self.config.period_s
        if arrivals is None:
            self.stopping.wait(max(0.0, deadline - time.monotonic()))
            return
        left = deadline - time.monotonic()
        if left > 0 and arrivals.wait(left) and not self.stopping.is_set():
            pause = max(0.0, min(self.config.min_period_s, deadline - time.monotonic()))
            (whole or self.stopping).wait(pause)

    def stop(self) -> None:
        self.stopping.set()
        arrivals = getattr(self.cache, "arrivals", None)
        if arrivals is not None:
            arrivals.set()  # the loop may wait on it
        whole = self._gang_whole()
        if whole is not None:
            whole.set()
        wake = getattr(self.cache, "pods_to_group", None)
        if wake is not None:
            wake.set()  # the grouper thread waits on it


def convert_intent(pg: Obj) -> bool:
    from kai_ray.api_names import BIND_INTENT_ANNOTATION

    return bool((pg["metadata"].get("annotations") or {}).get(BIND_INTENT_ANNOTATION))
