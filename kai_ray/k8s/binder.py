"""Carries a cycle's decisions out on the API server.

Crash safety: before binding any pod of a gang, the binder writes the gang's whole set of
decisions in one atomic write, an annotation on the PodGroup (`kai-ray.io/bind-intent`). The
cache reads intents back as pods in state Binding, so after a crash the restarted scheduler
neither re-decides them nor gives their room away, and `resume()` finishes the binds. A gang is
therefore never left partly bound by a crash.

GPU sharing as KAI does it: one reservation pod per shared device (namespace
`kai-resource-reservation`, `nvidia.com/gpu: 1`, pinned to the node) whose device plugin reports
the physical GPU id in annotation `run.ai/reserve_for_gpu_index`; sharing pods carry label
`runai-gpu-group` and get a per-pod ConfigMap with NVIDIA_VISIBLE_DEVICES and GPU_PORTION.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.core.result import Bind, CycleResult
from kai_ray.grouping import admission
from kai_ray.k8s import convert, rawapi
from kai_ray.k8s.cache import PG_GROUP, PG_PLURAL, PG_VERSION
from kai_ray.k8s.events import EventRecorder

log = logging.getLogger(__name__)
Obj = dict[str, Any]

RESERVATION_APP = "kai-resource-reservation"
GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"


@dataclass
class BinderConfig:
    reservation_timeout_s: float = 40.0
    workers: int = 16  # gangs bound at the same time
    reservation_image: str = "registry.k8s.io/pause:3.10"


class Binder:
    def __init__(self, api: client.ApiClient, events: EventRecorder,
                 config: BinderConfig | None = None) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.events = events
        self.config = config or BinderConfig()
        self.bound_total = 0
        self.reservation_ns_ready = False
        self.pool = ThreadPoolExecutor(max_workers=max(1, self.config.workers),
                                       thread_name_prefix="binder")

    # ------------------------------------------------------------------ intents
    def _patch_pg_annotations(self, pg: Obj, annotations: Mapping[str, str | None]) -> None:
        m = pg["metadata"]
        rawapi.patch_custom(self.api, PG_GROUP, PG_VERSION, m["namespace"], PG_PLURAL, m["name"],
                            {"metadata": {"annotations": dict(annotations)}})

    def write_intent(self, pg: Obj, binds: list[Bind]) -> None:
        intent = convert.bind_intent(pg)
        for b in binds:
            intent[b.pod] = {"node": b.node, "gpu_groups": list(b.gpu_groups),
                             "new_gpu_groups": list(b.new_gpu_groups),
                             "portion": b.gpu_portion, "memory_mib": b.gpu_memory_mib}
        self._patch_pg_annotations(pg, {convert.BIND_INTENT_ANNOTATION: json.dumps(intent)})
        pg["metadata"].setdefault("annotations", {})[convert.BIND_INTENT_ANNOTATION] = \
            json.dumps(intent)

    def resume(self, podgroups: Iterable[Obj], pods: dict[str, Obj]) -> int:
        """Finish binds a previous run (or cycle) recorded but did not complete."""
        done = 0
        for pg in podgroups:
            intent = convert.bind_intent(pg)
            if not intent:
                continue
            ns = pg["metadata"]["namespace"]
            binds = [Bind(job=pg["metadata"]["name"], namespace=ns, pod=name, node=v["node"],
                          gpu_groups=tuple(v.get("gpu_groups") or ()),
                          new_gpu_groups=tuple(v.get("new_gpu_groups") or ()),
                          gpu_portion=float(v.get("portion") or 0.0),
                          gpu_memory_mib=int(v.get("memory_mib") or 0), action="resume")
                     for name, v in intent.items()]
            done += self._bind_gang(pg, binds, pods)
        return done

    # ------------------------------------------------------------------ binds
    def apply_binds(self, result: CycleResult, podgroups: dict[str, Obj],
                    pods: dict[str, Obj], starting: Collection[str] = ()) -> int:
        """Bind the cycle's decisions, gangs concurrently. Jobs in `starting` (none of their
        pods ran before) get the last-start annotation once a bind succeeded, in the same
        PodGroup patch that clears a gang's intent (a separate one for a single pod)."""
        by_job: dict[str, list[Bind]] = {}
        for b in result.binds:
            by_job.setdefault(b.job, []).append(b)

        def one(job: str, binds: list[Bind]) -> int:
            pg = podgroups.get(job)
            if pg is None:
                return 0
            stamp = ({convert.LAST_START_ANNOTATION: convert.now_rfc3339()} if job in starting
                     else {})
            if len(binds) == 1:
                # one Binding is atomic: nothing can be left half done, no intent needed
                done = self._bind_gang(pg, binds, pods, intent=False)
                if done and stamp:
                    rawapi.annotate_quietly(self.api, PG_GROUP, PG_VERSION, PG_PLURAL,
                                            "PodGroup", pg, stamp)
                return done
            try:
                self.write_intent(pg, binds)
            except ApiException as e:
                log.warning("PodGroup %s: bind intent not written (%s); skipping its binds",
                            job, e.status)
                return 0
            return self._bind_gang(pg, binds, pods, started=stamp)

        # gangs are independent: bind them concurrently (each gang's pods in order)
        if len(by_job) <= 1 or self.config.workers <= 1:
            return sum(one(job, binds) for job, binds in by_job.items())
        futures = [self.pool.submit(one, job, binds) for job, binds in by_job.items()]
        return sum(f.result() for f in futures)

    def _bind_gang(self, pg: Obj, binds: list[Bind], pods: dict[str, Obj],
                   intent: bool = True, started: dict[str, str] | None = None) -> int:
        finished: list[str] = []
        done = 0
        for b in binds:
            pod = pods.get(f"{b.namespace}/{b.pod}")
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                finished.append(b.pod)  # gone: nothing to finish
                continue
            if (pod.get("spec") or {}).get("nodeName"):
                finished.append(b.pod)
                continue
            try:
                if b.gpu_groups:
                    self._prepare_shared_gpu(pod, b)
                self._bind(pod, b.node)
            except ApiException as e:
                if e.status in (404, 409, 422):
                    finished.append(b.pod)  # deleted, already bound, or refused for good
                log.warning("bind %s/%s -> %s failed: %s %s", b.namespace, b.pod, b.node,
                            e.status, e.reason)
                continue
            except ReservationTimeout as e:
                log.warning("%s", e)
                continue
            finished.append(b.pod)
            done += 1
            self.bound_total += 1
            self.events.emit(pod, "Scheduled",
                             f"Successfully assigned {b.namespace}/{b.pod} to {b.node}")
        if finished and intent:
            pending = convert.bind_intent(pg)
            for name in finished:
                pending.pop(name, None)
            value = json.dumps(pending) if pending else None
            update: dict[str, str | None] = {convert.BIND_INTENT_ANNOTATION: value}
            if done and started:
                update.update(started)
            try:
                self._patch_pg_annotations(pg, update)
            except ApiException as e:
                log.warning("PodGroup %s: intent not cleared (%s)", pg["metadata"]["name"],
                            e.status)
        return done

    def _bind(self, pod: Obj, node: str) -> None:
        m = pod["metadata"]
        rawapi.bind(self.api, m["namespace"], m["name"], m.get("uid"), node)

    # ------------------------------------------------------------------ GPU sharing
    def _ensure_reservation_namespace(self) -> None:
        if self.reservation_ns_ready:
            return
        try:
            self.core.create_namespace({"metadata": {"name": convert.RESERVATION_NAMESPACE}})
        except ApiException as e:
            if e.status == 403:  # the Helm chart creates it and grants no namespace create
                self.core.read_namespace(convert.RESERVATION_NAMESPACE)
            elif e.status != 409:
                raise
        self.reservation_ns_ready = True

    def _reservation(self, node: str, group: str) -> Obj | None:
        pods = self.core.list_namespaced_pod(
            convert.RESERVATION_NAMESPACE, label_selector=f"{convert.GPU_GROUP_LABEL}={group}",
            _preload_content=False)
        items: list[Obj] = json.loads(pods.data).get("items") or []
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return live[0] if live else None

    def _create_reservation(self, node: str, group: str) -> None:
        self._ensure_reservation_namespace()
        name = f"gpu-reservation-{node}-{group}"[:63].rstrip("-.").lower()
        body = {
            "metadata": {"name": name, "namespace": convert.RESERVATION_NAMESPACE,
                         "labels": {"app": RESERVATION_APP, convert.GPU_GROUP_LABEL: group},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "reservation", "image": self.config.reservation_image,
                                     "resources": {"limits": {convert.GPU: "1"},
                                                   "requests": {convert.GPU: "1"}}}]},
        }
        try:
            self.core.create_namespaced_pod(convert.RESERVATION_NAMESPACE, body)
        except ApiException as e:
            if e.status != 409:
                raise

    def _device_id(self, node: str, group: str) -> str:
        """The physical GPU id the reservation pod's device plugin reported for `group`."""
        deadline = time.monotonic() + self.config.reservation_timeout_s
        created = False
        while True:
            pod = self._reservation(node, group)
            if pod is None and not created:
                self._create_reservation(node, group)
                created = True
            elif pod is not None:
                gpu = (pod["metadata"].get("annotations") or {}).get(GPU_INDEX_ANNOTATION)
                if gpu:
                    return str(gpu)
            if time.monotonic() > deadline:
                raise ReservationTimeout(
                    f"reservation pod for GPU group {group} on {node} reported no device id "
                    f"(annotation {GPU_INDEX_ANNOTATION}) within "
                    f"{self.config.reservation_timeout_s:.0f}s")
            time.sleep(0.2)

    def _prepare_shared_gpu(self, pod: Obj, b: Bind) -> None:
        devices = [self._device_id(b.node, g) for g in b.gpu_groups]
        m = pod["metadata"]
        labels: dict[str, str] = {}
        if len(b.gpu_groups) == 1:
            labels[convert.GPU_GROUP_LABEL] = b.gpu_groups[0]
        else:
            labels.update({f"{convert.GPU_GROUP_LABEL}/{g}": g for g in b.gpu_groups})
        ann = m.get("annotations") or {}
        patch: dict[str, Any] = {"metadata": {"labels": labels}}
        if CONFIGMAP_ANNOTATION not in ann:
            # admitted without our webhook: still record where the env lives
            prefix = f"{m['name'][:40]}-shared-gpu"
            patch["metadata"]["annotations"] = {CONFIGMAP_ANNOTATION: prefix}
            ann = {**ann, CONFIGMAP_ANNOTATION: prefix}
        self.core.patch_namespaced_pod(m["name"], m["namespace"], patch)
        memory = b.gpu_memory_mib or None
        data = admission.gpu_configmap_data(devices, b.gpu_portion or 1.0, memory)
        cm = admission.gpu_configmap({**pod, "metadata": {**m, "annotations": ann}}, data)
        try:
            self.core.create_namespaced_config_map(m["namespace"], cm)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.replace_namespaced_config_map(cm["metadata"]["name"], m["namespace"], cm)

    def collect_reservations(self, pods: Iterable[Obj]) -> int:
        """Delete reservation pods whose device no pod shares any more."""
        in_use: set[str] = set()
        reservations: list[Obj] = []
        for pod in pods:
            m = pod.get("metadata") or {}
            if m.get("namespace") == convert.RESERVATION_NAMESPACE:
                if (m.get("labels") or {}).get("app") == RESERVATION_APP:
                    reservations.append(pod)
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                continue
            in_use.update(convert.gpu_groups(pod))
        removed = 0
        for r in reservations:
            group = (r["metadata"].get("labels") or {}).get(convert.GPU_GROUP_LABEL)
            if group in in_use or r["metadata"].get("deletionTimestamp"):
                continue
            try:
                self.core.delete_namespaced_pod(r["metadata"]["name"],
                                                convert.RESERVATION_NAMESPACE)
                removed += 1
            except ApiException as e:
                if e.status != 404:
                    log.warning("reservation pod %s not deleted: %s", r["metadata"]["name"],
                                e.status)
        return removed

    # ------------------------------------------------------------------ evictions
    def evict(self, pod: Obj, message: str, action: str) -> bool:
        m = pod["metadata"]
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=m["name"],
                                                              namespace=m["namespace"]))
        try:
            self.core.create_namespaced_pod_eviction(m["name"], m["namespace"], body)
        except ApiException as e:
            if e.status == 404:
                return False
            if e.status == 429:  # a disruption budget says not now; the next cycle retries
                log.info("eviction of %s/%s refused by a PodDisruptionBudget", m["namespace"],
                         m["name"])
                return False
            raise
        self.events.emit(pod, "Preempted" if action != "stalegangeviction" else "Evicted",
                         message, dedupe=False)
        return True


class ReservationTimeout(RuntimeError):
    pass


def last_start_needed(pg: Obj) -> bool:
    return convert.LAST_START_ANNOTATION not in (pg["metadata"].get("annotations") or {})


def stamp() -> str:
    return convert.now_rfc3339()
