"""Real Ray with its autoscaler on the real kubelet node, scheduled by kai-ray.

A RayCluster with in-tree autoscaling (ray_samples/raycluster-gpu-autoscaler.yaml, on the
kai-ray-ray image) gets a Ray job (ray_samples/gpu_autoscale_job.py) that wants more one-GPU
workers than the node's GPUs. Ray's autoscaler sidecar raises the worker group's replicas,
KubeRay creates the pods, kai-ray places those that fit; after the job the autoscaler names idle
workers in `workersToDelete`. A Recorder watches the RayCluster and its pods meanwhile, so the
run says how long each step took and whether anything it should not touch was touched.

    flock /tmp/kai-ray-realnode.lock python3 -m kai_ray.testing.ray_autoscale_bench \
        [--min-replicas 1 0] [--hold-seconds 30] [--out benchmarks/results/real_ray_autoscaler.json]

starts a plane with a real node (root; docs/real-node.md), the KubeRay operator and `kai-ray
run`, runs one scenario per --min-replicas value and writes the JSON.
tests/integration/test_real_ray_autoscaler.py runs the same scenario and asserts on it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

import kai_ray
from kai_ray import api_names
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.plane import ControlPlane

REPO = Path(kai_ray.__file__).resolve().parent.parent
SAMPLE = REPO / "ray_samples" / "raycluster-gpu-autoscaler.yaml"
JOB_SCRIPT = REPO / "ray_samples" / "gpu_autoscale_job.py"
RESULTS = REPO / "benchmarks" / "results" / "real_ray_autoscaler.json"
RAY = ("ray.io", "v1", "rayclusters")
QUEUE_API = api_names.QUEUE.gvp
QUEUE = "ray-autoscale"
REAL_NODE_LABEL = "kai-ray.io/real-node"
DASHBOARD_PORT = 8265
# kai-ray's reasons for taking a running pod away (kai_ray/k8s/binder.py)
EVICTION_REASONS = ("Evicted", "Preempted", "BindRolledBack")


def queue_manifest(name: str = QUEUE) -> dict[str, Any]:
    """An open top-level queue: the node's GPUs, not a quota, decide what fits."""
    open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {"apiVersion": api_names.QUEUE.api_version, "kind": api_names.QUEUE.kind,
            "metadata": {"name": name},
            "spec": {"resources": {r: dict(open_) for r in ("cpu", "gpu", "memory")}}}


def ensure_queue(cluster: Cluster, name: str = QUEUE) -> None:
    try:
        client.CustomObjectsApi(cluster.api_client()).create_cluster_custom_object(
            *QUEUE_API, queue_manifest(name))
    except ApiException as e:
        if e.status != 409:
            raise


def ray_cluster(image: str, min_replicas: int, *, queue: str = QUEUE,
                name: str | None = None, max_replicas: int = 3,
                idle_timeout_s: int | None = None) -> dict[str, Any]:
    """The sample, on a locally built image (nothing is pulled on the real node), pinned to
    the real node, with the worker group's minReplicas (= initial replicas) set."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["labels"][api_names.QUEUE_LABEL] = queue
    if name:
        doc["metadata"]["name"] = name
    spec = doc["spec"]
    opts = spec["autoscalerOptions"]
    # the sidecar would default to the head's image anyway; saying so keeps the pull policy
    # explicit: Never, as there is no registry here
    opts.update(image=image, imagePullPolicy="Never")
    if idle_timeout_s is not None:
        opts["idleTimeoutSeconds"] = idle_timeout_s
    (group,) = spec["workerGroupSpecs"]
    group.update(replicas=min_replicas, minReplicas=min_replicas, maxReplicas=max_replicas)
    for template in (spec["headGroupSpec"]["template"], group["template"]):
        # a dev cluster also has KWOK nodes, whose pods run no container
        template["spec"]["nodeSelector"] = {REAL_NODE_LABEL: "true"}
        for c in template["spec"]["containers"]:
            c["image"], c["imagePullPolicy"] = image, "Never"
    return doc


def _now() -> float:
    return time.time()  # wall clock: comparable with Ray's job start/end times


@dataclasses.dataclass
class PodTrack:
    """What one pod went through, as wall-clock times of the first sighting of each state."""

    name: str
    uid: str
    kind: str  # head | worker
    seen: float
    bound: float | None = None
    running: float | None = None
    ready: float | None = None
    deleting: float | None = None
    gone: float | None = None
    restarts: int = 0
    ip: str | None = None
    unschedulable: float | None = None
    unschedulable_reason: str | None = None
    unschedulable_message: str | None = None


class Recorder:
    """Watches one RayCluster and its pods (two threads) and keeps each change with its time."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.pods: dict[str, PodTrack] = {}  # by uid
        self.replicas: list[tuple[float, int]] = []
        self.workers_to_delete: dict[str, float] = {}  # pod name -> first time named
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Recorder:
        for target in (self._watch_pods, self._watch_cluster):
            t = threading.Thread(target=target, daemon=True, name=f"recorder-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the watches ---------------------------------------------------------------------------
    def _stream(self, list_fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any], on: Callable[[str, Any], None],
                version: Callable[[Any], str]) -> None:
        """List, then watch from that version; again from a fresh list when the watch breaks."""
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listing = list_fn(*args, **kwargs)
                    items = listing["items"] if isinstance(listing, dict) else listing.items
                    for item in items:
                        on("LISTED", item)
                    rv = (listing["metadata"]["resourceVersion"] if isinstance(listing, dict)
                          else listing.metadata.resource_version)
                # a short server timeout: stop() is noticed within seconds
                for ev in watch.Watch().stream(list_fn, *args, resource_version=rv,
                                               timeout_seconds=5, **kwargs):
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    on(ev["type"], ev["object"])
                    rv = version(ev["object"])
                    if self._stop.is_set():
                        break
            except ApiException as e:
                if e.status != 410:  # 410: the version is too old; list again
                    self._note(f"watch: {e.status} {e.reason}")
                    time.sleep(1)
                rv = None
            except Exception as e:  # a reset connection: list again
                self._note(f"watch: {type(e).__name__}: {e}")
                rv = None
                time.sleep(1)

    def _api(self) -> client.ApiClient:
        """A client of its own per watch thread: each blocks in its own connection."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.cluster.kubeconfig))

    def _note(self, error: str) -> None:
        with self._lock:
            self.errors.append(error)

    def _watch_pods(self) -> None:
        core = client.CoreV1Api(self._api())
        self._stream(core.list_namespaced_pod, (self.namespace,),
                     {"label_selector": f"ray.io/cluster={self.name}"}, self._on_pod,
                     lambda p: p.metadata.resource_version)

    def _watch_cluster(self) -> None:
        custom = client.CustomObjectsApi(self._api())
        self._stream(custom.list_namespaced_custom_object, (*RAY[:2], self.namespace, RAY[2]),
                     {"field_selector": f"metadata.name={self.name}"}, self._on_cluster,
                     lambda o: o["metadata"]["resourceVersion"])

    def _on_pod(self, kind: str, pod: Any) -> None:
        t = _now()
        m, status = pod.metadata, pod.status
        with self._lock:
            track = self.pods.get(m.uid)
            if track is None:
                node_type = (m.labels or {}).get("ray.io/node-type", "worker")
                track = self.pods[m.uid] = PodTrack(m.name, m.uid, node_type, t)
            if kind == "DELETED":
                track.gone = track.gone or t
            if m.deletion_timestamp and track.deleting is None:
                track.deleting = t
            if pod.spec.node_name and track.bound is None:
                track.bound = t
            if status.phase == "Running" and track.running is None:
                track.running = t
            track.ip = status.pod_ip or track.ip
            for c in status.conditions or []:
                if c.type == "Ready" and c.status == "True" and track.ready is None:
                    track.ready = t
                if (c.type == "PodScheduled" and c.status == "False"
                        and c.reason == "Unschedulable" and track.unschedulable is None):
                    track.unschedulable = t
                    track.unschedulable_reason = c.reason
                    track.unschedulable_message = c.message
            track.restarts = max(track.restarts, sum(
                cs.restart_count for cs in status.container_statuses or []))

    def _on_cluster(self, kind: str, obj: dict[str, Any]) -> None:
        t = _now()
        groups = obj.get("spec", {}).get("workerGroupSpecs") or []
        if not groups:
            return
        group = groups[0]
        with self._lock:
            replicas = int(group.get("replicas", 0))
            if not self.replicas or self.replicas[-1][1] != replicas:
                self.replicas.append((t, replicas))
            for name in (group.get("scaleStrategy") or {}).get("workersToDelete") or []:
                self.workers_to_delete.setdefault(name, t)

    # -- views ---------------------------------------------------------------------------------
    def snapshot(self) -> list[PodTrack]:
        with self._lock:
            return [dataclasses.replace(p) for p in self.pods.values()]

    def live(self, kind: str | None = None) -> list[PodTrack]:
        return [p for p in self.snapshot() if p.gone is None and p.deleting is None
                and (kind is None or p.kind == kind)]


@dataclasses.dataclass
class Scenario:
    """One run: the RayCluster, the job, and what the Recorder saw."""

    min_replicas: int
    namespace: str
    name: str
    gpus: int
    tasks: int
    hold_s: float
    recorder: Recorder
    created: float = 0.0
    submitted: float | None = None
    job_id: str | None = None
    job_status: str | None = None
    job_start: float | None = None
    job_end: float | None = None
    job_message: str | None = None
    job_results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    job_log_tail: str = ""
    scaled_down: float | None = None
    autoscaler_version: str | None = None
    autoscaler_log: str = ""
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    # -- facts ---------------------------------------------------------------------------------
    def pods(self) -> list[PodTrack]:
        return self.recorder.snapshot()

    def new_workers(self) -> list[PodTrack]:
        """Workers created for the job's demand (after its submission), oldest first."""
        t = self.submitted or float("inf")
        return sorted((p for p in self.pods() if p.kind == "worker" and p.seen >= t),
                      key=lambda p: p.seen)

    def heads(self) -> list[PodTrack]:
        return [p for p in self.pods() if p.kind == "head"]

    def named_for_deletion(self) -> dict[str, float]:
        return dict(self.recorder.workers_to_delete)

    def deleted(self) -> list[PodTrack]:
        """Pods deleted while the scenario ran (the test's own clean-up comes later)."""
        return [p for p in self.pods() if p.deleting is not None or p.gone is not None]

    def max_concurrent_tasks(self) -> int:
        """The most tasks of the job that ran at one moment (at some task's start)."""
        tasks = self.job_results
        return max((sum(1 for u in tasks if u["start"] <= t["start"] < u["end"])
                    for t in tasks), default=0)

    def fits(self) -> int:
        """How many of the job's new workers the node's GPUs can hold."""
        return min(self.gpus - self.min_replicas, self.tasks - self.min_replicas)

    def violations(self, final: bool = True) -> list[str]:
        """What must never happen: a running pod taken away or restarted, a pod deleted that
        the autoscaler did not name, an eviction by the scheduler. `final=False` (while the
        run goes on) leaves out the naming check: the two watches may see a named pod's
        deletion before the RayCluster's patch that named it."""
        out = []
        heads = self.heads()
        if len(heads) > 1 or (final and not heads):  # a second head: the first went
            out.append(f"{len(heads)} head pods seen: {[h.name for h in heads]}")
        named = self.named_for_deletion()
        for p in self.deleted():
            if p.kind == "head":
                out.append(f"head {p.name} deleted")
            elif final and p.name not in named:
                out.append(f"worker {p.name} deleted without being named in workersToDelete")
        for p in self.pods():
            if p.restarts:
                out.append(f"{p.name}: {p.restarts} container restarts")
        for ev in self.events:
            if ev["reason"] in EVICTION_REASONS:
                out.append(f"event {ev['reason']} on {ev['object']}: {ev['message']}")
        return out

    def measurements(self) -> dict[str, Any]:
        def since(t: float | None, t0: float | None) -> float | None:
            return None if t is None or t0 is None else round(t - t0, 2)

        sub, end = self.submitted, self.job_end
        new = self.new_workers()
        running = sorted(p.running for p in new if p.running is not None)
        ready = sorted(p.ready for p in new if p.ready is not None)
        up = next((t for t, r in self.recorder.replicas
                   if sub and t >= sub and r > self.min_replicas), None)
        named = self.named_for_deletion()
        named_after_end = sorted(t for t in named.values() if end and t >= end)
        gone = [p.gone for p in self.pods() if p.name in named and p.gone is not None]
        results = sorted(self.job_results, key=lambda r: r["start"])
        return {
            "submit_to_replicas_raised_s": since(up, sub),
            "submit_to_first_worker_created_s": since(new[0].seen if new else None, sub),
            "submit_to_first_worker_running_s": since(running[0] if running else None, sub),
            "submit_to_first_worker_ready_s": since(ready[0] if ready else None, sub),
            "submit_to_all_placeable_workers_running_s": since(
                running[self.fits() - 1] if len(running) >= self.fits() > 0 else None, sub),
            "submit_to_first_task_started_s": since(results[0]["start"] if results else None,
                                                    sub),
            "job_duration_s": since(end, self.job_start),
            "max_concurrent_tasks": self.max_concurrent_tasks(),
            "job_end_to_first_workers_to_delete_s": since(
                named_after_end[0] if named_after_end else None, end),
            "job_end_to_scaled_down_s": since(self.scaled_down, end),
            "first_workers_to_delete_before_job_end": bool(
                end and any(t < end for t in named.values())),
            "named_pod_deleted_to_gone_s": [
                round(p.gone - p.deleting, 2) for p in self.pods()
                if p.name in named and p.gone is not None and p.deleting is not None],
            "last_named_pod_gone_after_job_end_s": since(max(gone) if gone else None, end),
        }

    def as_dict(self) -> dict[str, Any]:
        t0 = self.submitted or self.created

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 2)

        return {
            "min_replicas": self.min_replicas, "gpus": self.gpus, "tasks": self.tasks,
            "hold_s": self.hold_s, "autoscaler_version": self.autoscaler_version,
            "job": {"id": self.job_id, "status": self.job_status, "message": self.job_message,
                    "start_s": rel(self.job_start), "end_s": rel(self.job_end),
                    "tasks": [{**r, "start": rel(r["start"]), "end": rel(r["end"])}
                              for r in sorted(self.job_results, key=lambda r: r["start"])]},
            "measurements": self.measurements(),
            "violations": self.violations(),
            "timeline_note": "seconds relative to the job's submission",
            "replicas": [(rel(t), r) for t, r in self.recorder.replicas],
            "workers_to_delete": {n: rel(t) for n, t in self.named_for_deletion().items()},
            "pods": [{"name": p.name, "kind": p.kind, "seen": rel(p.seen),
                      "bound": rel(p.bound), "running": rel(p.running), "ready": rel(p.ready),
                      "unschedulable": rel(p.unschedulable),
                      "unschedulable_message": p.unschedulable_message,
                      "deleting": rel(p.deleting), "gone": rel(p.gone),
                      "restarts": p.restarts} for p in sorted(self.pods(), key=lambda p: p.seen)],
            "scheduler_events": [e for e in self.events
                                 if e["reason"] in (*EVICTION_REASONS, "Unschedulable")],
            "watch_errors": self.recorder.errors,
        }


class ScenarioFailed(AssertionError):
    def __init__(self, message: str, scenario: Scenario) -> None:
        super().__init__(message)
        self.scenario = scenario


def _wait(what: str, check: Callable[[], Any], timeout: float, scenario: Scenario,
          detail: Callable[[], str], interval: float = 0.5) -> Any:
    """Poll `check`; stop at once if something that must not happen did (a head deleted, a
    restart): waiting longer would only hide when it happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        bad = scenario.violations(final=False)
        if bad:
            raise ScenarioFailed(f"while waiting for {what}: {'; '.join(bad)}\n{detail()}",
                                 scenario)
        time.sleep(interval)
    raise ScenarioFailed(f"timed out after {timeout:.0f}s waiting for {what}\n{detail()}",
                         scenario)


def describe(cluster: Cluster, namespace: str) -> str:
    """Pods of the namespace and their state, for failure messages."""
    core = client.CoreV1Api(cluster.api_client())
    lines = []
    for p in core.list_namespaced_pod(namespace).items:
        cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
        restarts = sum(c.restart_count for c in p.status.container_statuses or [])
        lines.append(f"{p.metadata.name}: {p.status.phase} node={p.spec.node_name} "
                     f"deleting={bool(p.metadata.deletion_timestamp)} restarts={restarts} "
                     f"sched={cond.message if cond else None}")
    return "\n".join(lines)


def namespace_events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    core = client.CoreV1Api(cluster.api_client())
    return [{"reason": e.reason, "object": f"{e.involved_object.kind}/{e.involved_object.name}",
             "message": e.message, "count": e.count, "source": e.source.component if e.source
             else None} for e in core.list_namespaced_event(namespace).items]


def autoscaler_log(cluster: Cluster, namespace: str, head: str) -> str:
    out = cluster.kubectl("logs", "-n", namespace, head, "-c", "autoscaler", check=False,
                          timeout=30)
    return out.stdout if out.returncode == 0 else f"(kubectl logs: {out.stderr.strip()})"


def autoscaler_version(log: str) -> str:
    """v1 or v2, from the sidecar's log: Ray picks it unless autoscalerOptions.version says."""
    if "Monitor: Started" in log:  # ray/autoscaler/_private/monitor.py
        return "v1"
    if "session_name:" in log:  # ray/autoscaler/v2/monitor.py
        return "v2"
    return "unknown"


def job_entrypoint() -> str:
    """The sample job, inline: the head's image does not have the ray_samples directory."""
    return "python3 -c " + shlex.quote(JOB_SCRIPT.read_text())


def _job_client(address: str, timeout: float) -> Any:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            return JobSubmissionClient(address)
        except Exception:  # the dashboard is not answering yet
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_scenario(cluster: Cluster, *, image: str, min_replicas: int, namespace: str,
                 queue: str = QUEUE, gpus: int = 2, tasks: int = 3, hold_s: float = 30,
                 name: str = "gpu-autoscaler", log: Callable[[str], None] = print,
                 scheduler_log: Callable[[], str] = lambda: "",
                 timeout_s: float = 600) -> Scenario:
    """Create the RayCluster in `namespace` (which must exist), submit the job from this
    machine to the head's dashboard on its pod IP, wait for the job and then for the autoscaler
    to bring the group back to minReplicas. The RayCluster is left for the caller to delete
    (`delete_ray_cluster`). Raises ScenarioFailed (with the Scenario so far) on a timeout."""
    api = cluster.api_client()
    custom = client.CustomObjectsApi(api)
    sc = Scenario(min_replicas, namespace, name, gpus, tasks, hold_s,
                  Recorder(cluster, namespace, name).start())

    def detail() -> str:
        return (f"pods:\n{describe(cluster, namespace)}\nreplicas: {sc.recorder.replicas}\n"
                f"workersToDelete: {sc.named_for_deletion()}\nscheduler:\n{scheduler_log()}")

    try:
        sc.created = _now()
        custom.create_namespaced_custom_object(
            RAY[0], RAY[1], namespace, RAY[2],
            ray_cluster(image, min_replicas, queue=queue, name=name))

        def started() -> bool:
            heads = [p for p in sc.recorder.live("head") if p.ready]
            workers = [p for p in sc.recorder.live("worker") if p.ready]
            return len(heads) == 1 and len(workers) >= min_replicas

        _wait(f"head and {min_replicas} worker(s) ready", started, 300, sc, detail)
        (head,) = sc.recorder.live("head")
        log(f"[min {min_replicas}] head {head.name} ready {(head.ready or 0) - sc.created:.1f}s "
            f"after create; ip {head.ip}")

        jobs = _job_client(f"http://{head.ip}:{DASHBOARD_PORT}", 120)
        sc.submitted = _now()
        sc.job_id = jobs.submit_job(entrypoint=job_entrypoint(), runtime_env={"env_vars": {
            "TASKS": str(tasks), "HOLD_S": str(hold_s)}})
        log(f"[min {min_replicas}] submitted {sc.job_id}")

        # the workers the GPUs can hold are placed while the job waits for them; the one that
        # does not fit waits (kai-ray's Unschedulable) without taking anything away
        fits = sc.fits()
        _wait(f"{fits} new worker(s) Running", lambda: len(
            [p for p in sc.new_workers() if p.running]) >= fits, 180, sc, detail)

        terminal = ("SUCCEEDED", "FAILED", "STOPPED")
        def job_log() -> str:
            return f"{detail()}\njob log:\n{jobs.get_job_logs(sc.job_id)[-3000:]}"

        _wait("the job to end", lambda: str(jobs.get_job_status(sc.job_id).value) in terminal,
              timeout_s, sc, job_log, interval=1)
        info = jobs.get_job_info(sc.job_id)
        sc.job_status, sc.job_message = str(info.status.value), info.message
        sc.job_start = info.start_time / 1000 if info.start_time else None
        sc.job_end = info.end_time / 1000 if info.end_time else None
        logs = jobs.get_job_logs(sc.job_id)
        sc.job_log_tail = logs[-3000:]
        for line in logs.splitlines():
            if line.startswith("RESULT "):
                sc.job_results = json.loads(line.removeprefix("RESULT "))
        log(f"[min {min_replicas}] job {sc.job_status} after "
            f"{(sc.job_end or _now()) - sc.submitted:.1f}s")
        if sc.job_status != "SUCCEEDED":
            raise ScenarioFailed(f"job {sc.job_status}: {sc.job_message}\n{logs[-3000:]}", sc)

        def back_to_min() -> bool:
            rec = sc.recorder
            workers = rec.live("worker")
            return (bool(rec.replicas) and rec.replicas[-1][1] == min_replicas
                    and len(workers) == min_replicas and all(w.ready for w in workers)
                    and not [p for p in rec.snapshot() if p.deleting and not p.gone])

        _wait(f"the autoscaler to scale the group back to {min_replicas}", back_to_min,
              timeout_s, sc, detail)
        sc.scaled_down = _now()
        log(f"[min {min_replicas}] scaled down {sc.scaled_down - (sc.job_end or 0):.1f}s "
            "after the job's end")
        time.sleep(3)  # a late deletion or restart would show here
        sc.autoscaler_log = autoscaler_log(cluster, namespace, head.name)
        sc.autoscaler_version = autoscaler_version(sc.autoscaler_log)
        return sc
    finally:
        sc.recorder.stop()
        sc.events = namespace_events(cluster, namespace)


def delete_ray_cluster(cluster: Cluster, namespace: str, name: str = "gpu-autoscaler",
                       timeout: float = 120) -> None:
    """Delete the RayCluster and wait until its pods are gone (their GPUs free)."""
    api = cluster.api_client()
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            RAY[0], RAY[1], namespace, RAY[2], name)
    except ApiException as e:
        if e.status != 404:
            raise
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name}").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"RayCluster {namespace}/{name}: pods left after {timeout:.0f}s")
        time.sleep(1)


def create_namespace(cluster: Cluster, namespace: str) -> None:
    try:
        client.CoreV1Api(cluster.api_client()).create_namespace(
            {"metadata": {"name": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise
    cluster.wait_service_account(namespace)


def wait_gpus_free(cluster: Cluster, timeout: float = 180) -> None:
    """Until no pod still holds an `nvidia.com/gpu` on the real node (an earlier test's
    RayCluster may still be going away)."""
    core = client.CoreV1Api(cluster.api_client())

    def holders() -> list[str]:
        out = []
        for p in core.list_pod_for_all_namespaces().items:
            if p.status.phase in ("Succeeded", "Failed") or not p.spec.node_name:
                continue
            if any(((c.resources and c.resources.limits) or {}).get("nvidia.com/gpu")
                   for c in p.spec.containers):
                out.append(f"{p.metadata.namespace}/{p.metadata.name}")
        return out

    deadline = time.monotonic() + timeout
    while held := holders():
        if time.monotonic() > deadline:
            raise TimeoutError(f"GPUs still held after {timeout:.0f}s by {held}")
        time.sleep(1)


def summary(sc: Scenario) -> str:
    """The numbers and the pods' timeline, for a test's output."""
    d = sc.as_dict()
    lines = [f"minReplicas {sc.min_replicas} (autoscaler {sc.autoscaler_version}), "
             f"job {sc.job_status}; seconds from the job's submission:"]
    lines += [f"  {k}: {v}" for k, v in d["measurements"].items()]
    lines.append(f"  replicas: {d['replicas']}")
    lines.append(f"  workersToDelete: {d['workers_to_delete']}")
    for p in d["pods"]:
        states = ", ".join(f"{k} {p[k]}" for k in ("seen", "bound", "running", "ready",
                                                   "unschedulable", "deleting", "gone")
                           if p[k] is not None)
        lines.append(f"  {p['name']}: {states}; restarts {p['restarts']}")
    lines += [f"  task {t['task']} on {t['host']}: {t['start']} -> {t['end']}"
              for t in d["job"]["tasks"]]
    lines += [f"  violation: {v}" for v in d["violations"]]
    return "\n".join(lines) + "\n"


# -- the stand-alone run --------------------------------------------------------------------------
def _environment() -> dict[str, Any]:
    import ray

    from kai_ray.testing import binaries

    kuberay = "unknown"
    with contextlib.suppress(Exception):
        kuberay = binaries.kuberay_dir().name  # e.g. v1.6.2
    return {"cpus": os.cpu_count(), "kernel": platform.release(), "python": sys.version.split()[0],
            "ray": ray.__version__, "kuberay": kuberay,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}


@dataclasses.dataclass
class _Stack:
    plane: ControlPlane
    scheduler_log: Callable[[], str]
    image: str


@contextlib.contextmanager
def _stack(work: Path) -> Iterator[_Stack]:
    """A plane with the real node, KubeRay, and kai-ray installed in it by its Helm chart, as a
    user runs it (kai_ray.testing.install)."""
    from kai_ray.testing import images
    from kai_ray.testing.install import ChartInstall
    from kai_ray.testing.realnode import RealNode

    plane = ControlPlane(real_node=True, kube_scheduler=True)
    plane.start()
    try:
        node = RealNode(plane, gpus=2).start()
        ray_image = images.ensure("kai-ray-ray")
        node.import_image(ray_image)
        start_kuberay_operator(plane)
        chart = ChartInstall(plane.kubeconfig, node, log=lambda m: print(m, file=sys.stderr))
        chart.install()
        try:
            yield _Stack(plane, lambda: chart.logs("scheduler", tail=200), ray_image.ref)
        finally:
            chart.uninstall()
    finally:
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-replicas", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--hold-seconds", type=float, default=30.0,
                        help="how long each of the job's one-GPU tasks holds its GPU")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the real node needs root")
    runs: list[dict[str, Any]] = []
    with (tempfile.TemporaryDirectory(prefix="kai-ray-ray-autoscale-") as tmp,
          _stack(Path(tmp)) as stack):
        ensure_queue(stack.plane)
        for i, min_replicas in enumerate(args.min_replicas):
            namespace = f"ray-autoscale-{i}"
            wait_gpus_free(stack.plane)
            create_namespace(stack.plane, namespace)
            try:
                sc = run_scenario(stack.plane, image=stack.image, min_replicas=min_replicas,
                                  namespace=namespace, hold_s=args.hold_seconds,
                                  scheduler_log=stack.scheduler_log)
                print(summary(sc))
                runs.append(sc.as_dict())
            except ScenarioFailed as e:
                print(f"minReplicas {min_replicas}: FAILED: {e}", file=sys.stderr)
                runs.append({**e.scenario.as_dict(), "failed": str(e).splitlines()[0],
                             "scheduler_log_tail": stack.scheduler_log().splitlines()[-40:]})
            finally:
                delete_ray_cluster(stack.plane, namespace)
    out = {"what": "Ray job asking for 3 one-GPU workers on a real kubelet node with 2 fake "
                   "GPUs: Ray's autoscaler sidecar (KubeRay in-tree autoscaling), the KubeRay "
                   "operator with batch scheduler kai-scheduler, kai-ray installed in the "
                   "cluster by its Helm chart",
           "command": "flock /tmp/kai-ray-realnode.lock python3 -m "
                      "kai_ray.testing.ray_autoscale_bench " + " ".join(argv or sys.argv[1:]),
           "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "environment": _environment(),
           "raycluster": str(SAMPLE.relative_to(REPO)), "job": str(JOB_SCRIPT.relative_to(REPO)),
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(not r.get("failed") and not r["violations"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
