"""What users see: pod conditions and events for pending pods, PodGroup conditions and
scheduling conditions, stale-gang annotations, Queue status and queue problems. Writes only
when something changed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.api_names import PODGROUP, QUEUE
from kai_ray.core.result import CycleResult, JobStatus, QueueShare
from kai_ray.k8s import convert, rawapi
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.provisional import is_provisional

log = logging.getLogger(__name__)
Obj = dict[str, Any]


def _fmt_cpu(millis: float) -> str:
    return f"{int(millis)}m"


def _fmt_gpu(gpus: float) -> str:
    return f"{gpus:g}" if gpus == int(gpus) else f"{round(gpus * 1000)}m"


def resource_list(values: tuple[float, float, float]) -> dict[str, str]:
    """(cpu millicores, memory bytes, GPUs) as a Kubernetes ResourceList."""
    cpu, memory, gpu = values
    out = {"cpu": _fmt_cpu(max(cpu, 0)), "memory": str(int(max(memory, 0))),
           convert.GPU: _fmt_gpu(max(gpu, 0))}
    return out


def not_scheduled(api: client.ApiClient, pod: Obj, reason: str, message: str) -> None:
    """Condition PodScheduled=False with `reason` and `message` on the pod (best effort: a pod
    gone meanwhile, or a refused write, is logged, never raised). A plain request, not
    CoreV1Api's: the first cycles write these for gangs still missing pods, and importing that
    class (every core model) then held the cycle for over a second."""
    body = {"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": reason,
        "message": message, "lastTransitionTime": convert.now_rfc3339()}]}}
    m = pod["metadata"]
    try:
        rawapi.patch_pod_status(api, m["namespace"], m["name"], body)
    except ApiException as e:
        if e.status != 404:
            log.warning("pod %s/%s condition not written: %s", m["namespace"], m["name"],
                        e.status)
    except Exception as e:  # a reset or a timeout: the next cycle writes it again
        log.warning("pod %s/%s condition not written: %s: %s", m["namespace"], m["name"],
                    type(e).__name__, e)


class StatusWriter:
    def __init__(self, api: client.ApiClient, events: EventRecorder, workers: int = 8) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status")
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.events = events
        self.queue_status: dict[str, Obj] = {}

    # ------------------------------------------------------------------ pending work
    def pending(self, result: CycleResult, podgroups: dict[str, Obj],
                pods: dict[str, Obj]) -> None:
        def one(status: JobStatus) -> None:
            try:
                pg = podgroups.get(status.job)
                for name in status.pending_pods:
                    pod = pods.get(f"{status.namespace}/{name}")
                    if pod is not None:
                        self._pod_unschedulable(pod, status, pg)
                if pg is not None and not is_provisional(pg):  # not written yet: nothing to
                    self._podgroup_unschedulable(pg, status)  # write on (the loop asks for it)
            except Exception as e:  # one job's status; the next cycle writes it again
                log.warning("status of %s/%s not written: %s: %s", status.namespace,
                            status.job, type(e).__name__, e)

        list(self.pool.map(one, result.job_status.values()))

    def _pod_unschedulable(self, pod: Obj, status: JobStatus, pg: Obj | None) -> None:
        message = f"{status.reason}: {status.message}" if status.reason not in (
            "Unschedulable",) else status.message
        self.events.emit(pod, "Unschedulable", message, type_="Warning")
        mark = True
        if pg is not None:
            mark = (pg.get("spec") or {}).get("markUnschedulable", True) is not False
        if not mark:
            return
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("message") == message:
                return
        not_scheduled(self.api, pod, "Unschedulable", message)

    def _podgroup_unschedulable(self, pg: Obj, status: JobStatus) -> None:
        self.events.emit(pg, "Unschedulable", f"{status.reason}: {status.message}",
                         kind="PodGroup", api_version=PODGROUP.api_version)
        self._owner_event(pg, status)
        current = (pg.get("status") or {}).get("schedulingConditions") or []
        if current and current[-1].get("message") == status.message:
            return
        transition = str(int(current[-1].get("transitionID", "0")) + 1) if current else "0"
        condition = {"type": "UnschedulableOnNodePool", "nodePool": "default",
                     "reason": "Unschedulable", "message": status.message, "status": "True",
                     "transitionID": transition, "lastTransitionTime": convert.now_rfc3339(),
                     "reasons": [{"reason": status.reason, "message": status.message}]}
        self._patch_pg_status(pg, {"schedulingConditions": [condition]})

    def _owner_event(self, pg: Obj, status: JobStatus) -> None:
        """The same on the workload users look at (a RayCluster, RayJob or RayService), so
        `kubectl describe raycluster` says why its gang waits, not just that pods are Pending."""
        m = pg["metadata"]
        for ref in m.get("ownerReferences") or []:
            if not str(ref.get("apiVersion", "")).startswith("ray.io/"):
                continue
            owner = {"metadata": {"name": ref.get("name"), "namespace": m.get("namespace"),
                                  "uid": ref.get("uid")}}
            self.events.emit(owner, "Unschedulable",
                             f"gang {m['name']} ({len(status.pending_pods)} pods pending): "
                             f"{status.reason}: {status.message}", kind=ref.get("kind", ""),
                             api_version=ref.get("apiVersion", ""), type_="Warning")

    def _patch_pg_status(self, pg: Obj, status: Obj) -> None:
        m = pg["metadata"]
        try:
            rawapi.patch_custom(self.api, PODGROUP, m["namespace"],
                                m["name"], {"status": status}, subresource="status")
        except ApiException as e:
            if e.status != 404:
                log.warning("PodGroup %s status not written: %s", m["name"], e.status)
        except Exception as e:  # a reset or a timeout: written again next cycle
            log.warning("PodGroup %s status not written: %s: %s", m["name"],
                        type(e).__name__, e)

    def clear_scheduled(self, podgroups: Iterable[Obj], pending_jobs: set[str]) -> None:
        """Drop the Unschedulable scheduling condition of groups that have nothing pending
        (`pending_jobs`: job keys, `ns/name`)."""
        for pg in podgroups:
            m = pg["metadata"]
            if convert.job_key(m.get("namespace", "default"), m["name"]) in pending_jobs:
                continue
            if (pg.get("status") or {}).get("schedulingConditions"):
                self._patch_pg_status(pg, {"schedulingConditions": None})

    # ------------------------------------------------------------------ annotations
    def stale(self, result: CycleResult, podgroups: dict[str, Obj]) -> None:
        for job, when in result.stale_set.items():
            self._annotate(podgroups.get(job), api_names.STALE_ANNOTATION,
                           datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        for job in result.stale_cleared:
            self._annotate(podgroups.get(job), api_names.STALE_ANNOTATION, None)
        for job, ev in {e.job: e for e in result.evictions}.items():
            pg = podgroups.get(job)
            if pg is not None and not is_provisional(pg):
                self.events.emit(pg, "Evict", ev.message, kind="PodGroup",
                                 api_version=PODGROUP.api_version)

    def _annotate(self, pg: Obj | None, key: str, value: str | None) -> None:
        if pg is not None and not is_provisional(pg):
            rawapi.annotate_quietly(self.api, PODGROUP, pg,
                                    {key: value})

    # ------------------------------------------------------------------ queues
    def queues(self, shares: dict[str, QueueShare], queue_objs: Iterable[Obj],
               problems: Iterable[convert.Problem]) -> None:
        children: dict[str, list[str]] = {}
        for q in shares.values():
            if q.parent:
                children.setdefault(q.parent, []).append(q.name)
        bad = {p.name: p for p in problems if p.kind == "Queue"}
        names = {o["metadata"]["name"]: o for o in queue_objs}
        for name, obj in names.items():
            share = shares.get(name)
            status: Obj = {}
            if share is not None:
                status = {"allocated": resource_list(share.allocated),
                          "allocatedNonPreemptible": resource_list(
                              share.allocated_non_preemptible),
                          "requested": resource_list(share.requested),
                          "fairShare": resource_list(share.fair_share),
                          "childQueues": sorted(children.get(name, [])) or None}
            conditions = []
            parent = (obj.get("spec") or {}).get("parentQueue")
            if name in bad:
                conditions.append({"type": "Valid", "status": "False", "reason": "InvalidSpec",
                                   "message": str(bad[name])})
            elif share is None and parent and parent not in names:
                conditions.append({"type": "Orphan", "status": "True", "reason": "ParentNotFound",
                                   "message": f"parent queue '{parent}' does not exist; jobs "
                                              "in this queue are not scheduled"})
            status["conditions"] = conditions or None
            if self.queue_status.get(name) == status:
                continue
            try:
                self.custom.patch_cluster_custom_object_status(
                    *QUEUE.gvp, name, {"status": status})
                self.queue_status[name] = status
            except ApiException as e:
                if e.status != 404:
                    log.warning("Queue %s status not written: %s", name, e.status)
            except Exception as e:  # a reset or a timeout: written again next cycle
                log.warning("Queue %s status not written: %s: %s", name, type(e).__name__, e)
