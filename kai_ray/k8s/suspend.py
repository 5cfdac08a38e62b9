"""Preemption a RayJob survives (KAI issue #1401): suspend the RayJob instead of evicting its
whole gang, and resume it when the gang fits again.

KubeRay v1.6.2 does not re-create the head pod of a provisioned SidecarMode RayJob: it marks the
RayJob Failed ("Ray head pod not found."). RayClusters, RayServices and the other RayJob modes
get their pods re-created, which then wait as a gang. A RayJob with `spec.suspend: true` has its
RayCluster deleted by KubeRay (status Suspended); `suspend: false` brings a fresh one.

So when the core evicts every running pod of a gang whose PodGroup belongs to a RayJob that
KubeRay lets suspend (status Running or Initializing, `shutdownAfterJobFinishes: true`, no
`clusterSelector`), the pods are not evicted: the RayJob is suspended and the PodGroup keeps the
gang's pods as annotation `kai-ray.io/suspended-demand`. While the PodGroup has no pods, the
snapshot gets those pods back as pending stand-ins (`stand_in_pods`), so the gang keeps its
place in the queue and its PodGroup condition; when the core binds the stand-ins (the gang fits),
the RayJob is resumed instead. Setting annotation `kai.scheduler/eviction-strategy` to anything but
`suspend` on the RayJob (it is copied to the PodGroup) turns this off for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.api_names import PODGROUP
from kai_ray.k8s.events import EventRecorder

log = logging.getLogger(__name__)
Obj = dict[str, Any]

DEMAND_ANNOTATION = "kai-ray.io/suspended-demand"
STRATEGY_ANNOTATION = "kai.scheduler/eviction-strategy"
SUSPENDABLE_STATES = ("Running", "Initializing")
# pod annotations that change what a pod asks for (GPU sharing)
_REQUEST_ANNOTATIONS = ("gpu-fraction", "gpu-memory", "gpu-fraction-num-devices")


def rayjob_owner(pg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The RayJob ownerReference of a PodGroup, if it belongs to one."""
    for ref in (pg.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "RayJob" and str(ref.get("apiVersion", "")).startswith("ray.io/"):
            return dict(ref)
    return None


def wants_suspend(pg: Mapping[str, Any]) -> bool:
    ann = (pg.get("metadata") or {}).get("annotations") or {}
    return rayjob_owner(pg) is not None and ann.get(STRATEGY_ANNOTATION, "suspend") == "suspend"


def demand_of(pods: Iterable[Mapping[str, Any]]) -> list[Obj]:
    """What the stand-ins need of each pod: name, labels, the request annotations, containers'
    resources, node selector."""
    out = []
    for pod in pods:
        m = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        ann = {k: v for k, v in (m.get("annotations") or {}).items()
               if k in _REQUEST_ANNOTATIONS}
        out.append({
            "name": m["name"], "labels": dict(m.get("labels") or {}), "annotations": ann,
            "containers": [{"name": c.get("name", "c"), "resources": c.get("resources") or {}}
                           for c in spec.get("containers") or []],
            "nodeSelector": dict(spec.get("nodeSelector") or {}),
            "schedulerName": spec.get("schedulerName", "kai-scheduler")})
    return out


def stand_in_pods(pg: Mapping[str, Any]) -> list[Obj]:
    """Pending pods standing for a suspended gang (none unless the PodGroup records one)."""
    m = pg.get("metadata") or {}
    raw = (m.get("annotations") or {}).get(DEMAND_ANNOTATION)
    if not raw:
        return []
    try:
        demand = json.loads(raw)
    except ValueError:
        return []
    pods = []
    for d in demand if isinstance(demand, list) else []:
        labels = dict(d.get("labels") or {})
        pods.append({
            "metadata": {"name": d["name"], "namespace": m.get("namespace"), "labels": labels,
                         "annotations": {**(d.get("annotations") or {}),
                                         api_names.POD_GROUP_ANNOTATION: m["name"]},
                         "creationTimestamp": m.get("creationTimestamp"), "uid": ""},
            "spec": {"containers": d.get("containers") or [],
                     "nodeSelector": d.get("nodeSelector") or {},
                     "schedulerName": d.get("schedulerName", "kai-scheduler")},
            "status": {"phase": "Pending"}})
    return pods


class Suspender:
    def __init__(self, api: client.ApiClient, events: EventRecorder) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.events = events

    def _rayjob(self, pg: Obj) -> Obj | None:
        ref = rayjob_owner(pg)
        if ref is None:
            return None
        group, _, version = str(ref["apiVersion"]).partition("/")
        try:
            job: Obj = self.custom.get_namespaced_custom_object(
                group, version, pg["metadata"]["namespace"], "rayjobs", ref["name"])
        except ApiException as e:
            if e.status != 404:
                log.warning("RayJob %s not read: %s", ref["name"], e.status)
            return None
        return job if job["metadata"].get("uid") == ref.get("uid") else None

    @staticmethod
    def suspendable(job: Obj) -> str | None:
        """Why KubeRay would refuse to suspend this RayJob (None: it would not)."""
        spec = job.get("spec") or {}
        state = (job.get("status") or {}).get("jobDeploymentStatus")
        if spec.get("suspend"):
            return "already suspended"
        if state not in SUSPENDABLE_STATES:
            return f"status {state!r} (KubeRay suspends only {', '.join(SUSPENDABLE_STATES)})"
        if not spec.get("shutdownAfterJobFinishes"):
            return "shutdownAfterJobFinishes is not true"
        if spec.get("clusterSelector"):
            return "it runs on an existing cluster (clusterSelector)"
        return None

    def _patch_job(self, job: Obj, suspend: bool) -> None:
        group, _, version = str(job["apiVersion"]).partition("/")
        m = job["metadata"]
        self.custom.patch_namespaced_custom_object(
            group, version, m["namespace"], "rayjobs", m["name"], {"spec": {"suspend": suspend}})

    def _annotate(self, pg: Obj, value: str | None) -> None:
        m = pg["metadata"]
        self.custom.patch_namespaced_custom_object(
            PODGROUP.group, PODGROUP.version, m["namespace"], PODGROUP.plural, m["name"],
            {"metadata": {"annotations": {DEMAND_ANNOTATION: value}}})

    def suspend(self, pg: Obj, pods: list[Obj], message: str) -> bool:
        """Suspend the RayJob of `pg` instead of evicting `pods` (its whole running gang).
        False when it cannot be suspended: evict as usual then."""
        if not wants_suspend(pg):
            return False
        job = self._rayjob(pg)
        if job is None:
            return False
        if job["spec"].get("suspend"):
            return True  # done in an earlier cycle; KubeRay is still deleting the cluster
        why_not = self.suspendable(job)
        if why_not is not None:
            log.info("RayJob %s/%s not suspended (%s): evicting its pods",
                     job["metadata"]["namespace"], job["metadata"]["name"], why_not)
            return False
        try:
            # the demand first: a crash between the two writes leaves a gang waiting, not lost
            self._annotate(pg, json.dumps(demand_of(pods), separators=(",", ":")))
        except ApiException as e:
            log.warning("RayJob %s not suspended (PodGroup %s not annotated: %s %s): evicting "
                        "its pods", job["metadata"]["name"], pg["metadata"]["name"], e.status,
                        e.reason)
            return False
        try:
            self._patch_job(job, True)
        except Exception as e:  # refused (403: no RBAC to patch rayjobs), a fault
            why = f"{e.status} {e.reason}" if isinstance(e, ApiException) else repr(e)
            log.warning("RayJob %s/%s not suspended (%s%s): evicting its pods",
                        job["metadata"]["namespace"], job["metadata"]["name"], why,
                        ": the scheduler may not patch rayjobs.ray.io"
                        if getattr(e, "status", None) == 403 else "")
            # its pods are evicted instead; the demand left behind would live on as stand-in
            # pods once they are gone, holding room for a gang that is not suspended
            try:
                self._annotate(pg, None)
            except Exception as undo:
                log.warning("PodGroup %s: annotation %s not removed: %s",
                            pg["metadata"]["name"], DEMAND_ANNOTATION, undo)
            return False
        self.events.emit(job, "Suspended", f"{message}; the RayJob is suspended and resumes "
                         "when its gang fits again", kind="RayJob",
                         api_version=job["apiVersion"], type_="Warning", dedupe=False)
        return True

    def resume(self, pg: Obj) -> bool:
        """The suspended gang fits: resume its RayJob and forget the stand-ins."""
        job = self._rayjob(pg)
        try:
            if job is not None and job["spec"].get("suspend"):
                self._patch_job(job, False)
            self._annotate(pg, None)
        except ApiException as e:
            log.warning("PodGroup %s: RayJob not resumed: %s %s", pg["metadata"]["name"],
                        e.status, e.reason)
            return False
        if job is not None:
            self.events.emit(job, "Resumed", "its gang fits again: the RayJob is resumed",
                             kind="RayJob", api_version=job["apiVersion"], dedupe=False)
        return True
