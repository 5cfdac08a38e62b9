"""The schedulers benchmarks compare kai-ray with, run on a local `ControlPlane`.

One class per scheduler knows (a) what an admin installs for it (CRDs, queues, config), (b) how
to start its processes on the plane with a client rate limit and no leader election, and (c) how
its users make a gang (PodGroup + pods with its labels and annotations) and a bare pod:

    kai            kai-ray (`kai-ray run`)
    kube           the stock kube-scheduler (no gangs: a gang's pods are placed one by one)
    kai-scheduler  NVIDIA KAI-Scheduler: scheduler, binder and pod grouper
    volcano        Volcano: vc-scheduler and vc-controller-manager (PodGroup + queue controllers)
    coscheduling   scheduler-plugins: kube-scheduler with the Coscheduling plugin, and its
                   PodGroup controller
    yunikorn       Apache YuniKorn (k8shim): gangs are task groups, served by placeholder pods

The peers' binaries come from `tools/peers/build.sh` (`peer_dir()`), the plane's from
`tools/cluster/build.sh`. Every pod asks for the same CPU and memory (and GPUs when asked), so
one workload fits every scheduler.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.testing import binaries, procs
from kai_ray.testing.cluster import load_yaml_documents
from kai_ray.testing.plane import Component, ControlPlane
from kai_ray.testing.scheduler_process import KaiRayProcess

Obj = dict[str, Any]
QUEUE = "bench"


class PeersMissing(RuntimeError):
    """A peer's binaries are not built (tools/peers/build.sh)."""


def peers_build_script() -> Path | None:
    root = binaries.repo_root()
    return root / "tools" / "peers" / "build.sh" if root else None


@functools.cache
def peer_dir() -> Path:
    """Where tools/peers/build.sh puts (or would put) the peers; KAI_RAY_PEERS_DIR overrides."""
    env = os.environ.get("KAI_RAY_PEERS_DIR")
    if env:
        return Path(env)
    script = peers_build_script()
    if script is None:
        raise PeersMissing("no tools/peers/build.sh next to this package: set KAI_RAY_PEERS_DIR")
    out = subprocess.run([str(script), "--print-dir"], capture_output=True, text=True,
                         check=False, timeout=120)
    if out.returncode != 0:
        raise PeersMissing(f"{script} --print-dir failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


def peers_built(*names: str) -> tuple[bool, str]:
    """Whether `tools/peers/build.sh --check NAME...` passes, and what it said if not."""
    script = peers_build_script()
    if script is None:
        return False, "no tools/peers/build.sh"
    out = subprocess.run([str(script), "--check", *names], capture_output=True, text=True,
                         check=False, timeout=120)
    return out.returncode == 0, out.stderr.strip()


def base_pod(name: str, scheduler_name: str, gpus: int = 0, *, labels: dict[str, str] | None
             = None, annotations: dict[str, str] | None = None) -> Obj:
    """The benchmark pod: 100m CPU and 128Mi, `gpus` whole GPUs, no owner (a bare pod)."""
    meta: Obj = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    resources: Obj = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "schedulerName": scheduler_name,
        "containers": [{"name": "c", "image": "example.invalid/x:1", "resources": resources}]}}


@dataclass
class Peer:
    """A scheduler under test. Subclasses fill in the peer-specific parts."""

    key: ClassVar[str]
    #: pods' spec.schedulerName
    scheduler_name: ClassVar[str]
    #: whether its gangs are all-or-nothing (kube-scheduler places a gang's pods one by one)
    gangs: ClassVar[bool] = True
    #: binaries it needs from tools/peers/build.sh (None: from tools/cluster/build.sh or kai-ray)
    build_name: ClassVar[str | None] = None

    #: where the peer keeps files of its own (config, kai-ray's log); made on first use
    workdir_: Path | None = None
    components: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        if self.workdir_ is None:
            self.workdir_ = Path(tempfile.mkdtemp(prefix="kai-ray-peer-"))
        return self.workdir_

    # -- what an admin does once ------------------------------------------------------------
    def install(self, plane: ControlPlane, namespace: str) -> None:
        """CRDs and the objects an admin creates (queues, config); the namespace exists."""

    # -- the scheduler's processes ------------------------------------------------------------
    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        raise NotImplementedError

    def stop(self, plane: ControlPlane) -> None:
        """Stop what start() started (plane components also stop with the plane)."""
        for name in self.components:
            comp = plane.components.pop(name, None)
            if comp is not None and comp.proc is not None:
                procs.stop_group(comp.pid, proc=comp.proc)
        self.components.clear()

    def pids(self, plane: ControlPlane) -> dict[str, int]:
        return {n: plane.components[n].pid for n in self.components if n in plane.components}

    def logs(self, plane: ControlPlane) -> dict[str, Path]:
        return {n: plane.components[n].log for n in self.components if n in plane.components}

    def _spawn(self, plane: ControlPlane, name: str, argv: list[str],
               env: dict[str, str] | None = None) -> Component:
        """A plane component with its own environment (plane.add_component takes none)."""
        log = plane.logs_dir / f"{name}.log"
        proc = procs.spawn(argv, log, detached=plane.detached,
                           env={**os.environ, **env} if env else None)
        comp = Component(name, proc.pid, log, argv[0], proc)
        plane.components[name] = comp
        self.components.append(name)
        return comp

    def _bin(self, name: str, *, executable: bool = True) -> str:
        assert self.build_name is not None
        path = peer_dir() / self.build_name / name
        if not os.access(path, os.X_OK if executable else os.R_OK):
            raise PeersMissing(f"{path} missing: run tools/peers/build.sh {self.build_name}")
        return str(path)

    def _crds(self) -> list[Obj]:
        assert self.build_name is not None
        files = sorted((peer_dir() / self.build_name / "crds").glob("*.yaml"))
        if not files:
            raise PeersMissing(f"no CRDs under {peer_dir() / self.build_name / 'crds'}")
        return [d for f in files for d in load_yaml_documents(f)
                if d.get("kind") == "CustomResourceDefinition"]

    # -- what a user creates ------------------------------------------------------------------
    def group(self, name: str, size: int) -> tuple[str, str, str, Obj] | None:
        """The gang's group object as (group, version, plural, body), if the peer has one."""
        return None

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        """A pod of gang `gang` (of `size` pods), or a bare pod when gang is None."""
        return base_pod(name, self.scheduler_name, gpus)

    def create_group(self, api: client.ApiClient, namespace: str, name: str, size: int) -> None:
        g = self.group(name, size)
        if g is not None:
            group, version, plural, body = g
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                group, version, namespace, plural, body)

    def gang(self, name: str, size: int, gpus: int = 0) -> tuple[Obj | None, list[Obj]]:
        """A gang as its users make it: the group object (if any) and its pods."""
        g = self.group(name, size)
        return (g[3] if g else None,
                [self.pod(f"{name}-{k}", name, size, gpus) for k in range(size)])

    def is_own_pod(self, pod: Obj) -> bool:
        """False for pods the scheduler itself creates (YuniKorn's placeholders)."""
        return True


def _rate(qps: int, burst: int) -> list[str]:
    return [f"--kube-api-qps={qps}", f"--kube-api-burst={burst}"]


@dataclass
class KaiRay(Peer):
    """kai-ray: `kai-ray run` (its CRDs are the plane's own); one open Queue."""

    key: ClassVar[str] = "kai"
    scheduler_name: ClassVar[str] = "kai-scheduler"
    proc: KaiRayProcess | None = None

    def install(self, plane: ControlPlane, namespace: str) -> None:
        open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
        client.CustomObjectsApi(plane.api_client()).create_cluster_custom_object(
            *api_names.QUEUE.gvp, {
                "apiVersion": api_names.QUEUE.api_version, "kind": api_names.QUEUE.kind,
                "metadata": {"name": QUEUE},
                "spec": {"resources": {"gpu": open_, "cpu": open_, "memory": open_}}})

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        self.proc = KaiRayProcess(plane.kubeconfig, self.workdir,
                                  ["--leader-election", "off", *_rate(qps, burst)])
        self.proc.start()

    def stop(self, plane: ControlPlane) -> None:
        if self.proc is not None:
            self.proc.stop()

    def pids(self, plane: ControlPlane) -> dict[str, int]:
        return {"kai-ray": self.proc.proc.pid} if self.proc and self.proc.proc else {}

    def logs(self, plane: ControlPlane) -> dict[str, Path]:
        return {"kai-ray": self.proc.log_path} if self.proc else {}

    def group(self, name: str, size: int) -> tuple[str, str, str, Obj] | None:
        return _kai_podgroup(name, size)

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        return _kai_pod(name, gang, gpus)


def _kai_podgroup(name: str, size: int) -> tuple[str, str, str, Obj]:
    return (*api_names.PODGROUP.gvp, {
        "apiVersion": api_names.PODGROUP.api_version, "kind": api_names.PODGROUP.kind,
        "metadata": {"name": name}, "spec": {"queue": QUEUE, "minMember": size}})


def _kai_pod(name: str, gang: str | None, gpus: int) -> Obj:
    # KAI's convention: the queue label on every pod; a pod that names its PodGroup is left
    # alone by the pod grouper, a bare pod gets one from it
    return base_pod(name, "kai-scheduler", gpus, labels={api_names.QUEUE_LABEL: QUEUE},
                    annotations={api_names.POD_GROUP_ANNOTATION: gang} if gang else None)


@dataclass
class KubeScheduler(Peer):
    """The stock kube-scheduler 1.34 (tools/cluster/build.sh); no gangs."""

    key: ClassVar[str] = "kube"
    scheduler_name: ClassVar[str] = "default-scheduler"
    gangs: ClassVar[bool] = False

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        bins = binaries.require("kube-scheduler")
        self._spawn(plane, "kube-scheduler", [
            str(bins["kube-scheduler"]), f"--kubeconfig={plane.kubeconfig}",
            "--leader-elect=false", "--secure-port=0", "--profiling=false", *_rate(qps, burst)])


@dataclass
class KaiScheduler(Peer):
    """NVIDIA KAI-Scheduler: the scheduler (decides, writes BindRequests), the binder (binds
    them) and the pod grouper (a PodGroup for each bare pod), each with --qps/--burst."""

    key: ClassVar[str] = "kai-scheduler"
    scheduler_name: ClassVar[str] = "kai-scheduler"
    build_name: ClassVar[str | None] = "kai-scheduler"

    def install(self, plane: ControlPlane, namespace: str) -> None:
        # KAI's own CRDs replace kai-ray's copies of the same names (the plane installs those)
        plane.install_crds(self._crds(), timeout=60)
        custom = client.CustomObjectsApi(plane.api_client())
        open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
        # KAI's quick start: a parent queue and a leaf queue under it that workloads name
        for name, parent in (("default", None), (QUEUE, "default")):
            spec: Obj = {"resources": {"gpu": open_, "cpu": open_, "memory": open_}}
            if parent:
                spec["parentQueue"] = parent
            custom.create_cluster_custom_object(*api_names.QUEUE.gvp, {
                "apiVersion": api_names.QUEUE.api_version, "kind": api_names.QUEUE.kind,
                "metadata": {"name": name}, "spec": spec})
        # the binder's namespace for GPU-sharing reservation pods (its Helm chart creates it)
        _ensure_namespace(plane, "kai-resource-reservation")

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        env = {"KUBECONFIG": str(plane.kubeconfig)}
        rate = [f"--qps={qps}", f"--burst={burst}"]
        metrics, plugins = procs.free_ports(2)
        # "0" turns a controller-runtime endpoint off; the scheduler's must listen somewhere
        self._spawn(plane, "kai-scheduler", [
            self._bin("scheduler"), "--leader-elect=false", *rate,
            f"--listen-address=127.0.0.1:{metrics}", f"--plugin-server-port={plugins}"], env)
        self._spawn(plane, "kai-binder", [
            self._bin("binder"), "--leader-elect=false", *rate,
            "--metrics-bind-address=0", "--health-probe-bind-address=0"], env)
        self._spawn(plane, "kai-podgrouper", [
            self._bin("podgrouper"), "--leader-elect=false", *rate,
            "--metrics-bind-address=0", "--health-probe-bind-address=0"], env)

    def group(self, name: str, size: int) -> tuple[str, str, str, Obj] | None:
        return _kai_podgroup(name, size)

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        return _kai_pod(name, gang, gpus)


@dataclass
class Volcano(Peer):
    """Volcano: vc-scheduler (--kube-api-qps/--kube-api-burst) and vc-controller-manager with
    its PodGroup controller (a PodGroup per bare pod) and queue controller (queue state)."""

    key: ClassVar[str] = "volcano"
    scheduler_name: ClassVar[str] = "volcano"
    build_name: ClassVar[str | None] = "volcano"

    def install(self, plane: ControlPlane, namespace: str) -> None:
        plane.install_crds(self._crds(), timeout=60)
        client.CustomObjectsApi(plane.api_client()).create_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", {
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                "metadata": {"name": QUEUE}, "spec": {"weight": 1, "reclaimable": True}})

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        kc = f"--kubeconfig={plane.kubeconfig}"
        listen, healthz, cm_listen, cm_healthz = procs.free_ports(4)
        self._spawn(plane, "vc-controller-manager", [
            self._bin("vc-controller-manager"), kc, "--leader-elect=false", *_rate(qps, burst),
            # the two controllers a scheduler of plain pods and PodGroups needs (the others
            # serve Volcano Jobs, JobFlows, CronJobs and HyperNodes)
            "--controllers=pg-controller,queue-controller",
            f"--listen-address=127.0.0.1:{cm_listen}",
            f"--healthz-address=127.0.0.1:{cm_healthz}"])
        self._spawn(plane, "vc-scheduler", [
            self._bin("vc-scheduler"), kc, "--leader-elect=false", *_rate(qps, burst),
            # the actions and plugins its Helm chart configures (the built-in default lacks
            # binpack)
            f"--scheduler-conf={self._bin('volcano-scheduler.conf', executable=False)}",
            f"--listen-address=127.0.0.1:{listen}", f"--healthz-address=127.0.0.1:{healthz}"])

    def group(self, name: str, size: int) -> tuple[str, str, str, Obj] | None:
        return ("scheduling.volcano.sh", "v1beta1", "podgroups", {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name}, "spec": {"queue": QUEUE, "minMember": size}})

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        # a gang's pods name their PodGroup; a bare pod names its queue, and the PodGroup
        # controller makes its PodGroup in that queue
        ann = ({"scheduling.k8s.io/group-name": gang} if gang
               else {"scheduling.volcano.sh/queue-name": QUEUE})
        return base_pod(name, self.scheduler_name, gpus, annotations=ann)


@dataclass
class Coscheduling(Peer):
    """scheduler-plugins: kube-scheduler with the Coscheduling plugin (a profile of its own),
    and the scheduler-plugins controller that keeps PodGroup status."""

    key: ClassVar[str] = "coscheduling"
    scheduler_name: ClassVar[str] = "scheduler-plugins-scheduler"
    build_name: ClassVar[str | None] = "coscheduling"
    #: how long a gang's bound-so-far pods wait at Permit for the rest (the project's manifest)
    permit_wait_seconds: int = 10

    def install(self, plane: ControlPlane, namespace: str) -> None:
        plane.install_crds(self._crds(), timeout=60)

    def config(self, kubeconfig: Path, qps: int, burst: int) -> Obj:
        """KubeSchedulerConfiguration: with --config, kube-scheduler ignores --kube-api-qps, so
        the rate limit is clientConnection's."""
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
            "profiles": [{
                "schedulerName": self.scheduler_name,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {"enabled": [{"name": "Coscheduling"}],
                                  "disabled": [{"name": "*"}]}},
                "pluginConfig": [{"name": "Coscheduling", "args": {
                    "permitWaitingTimeSeconds": self.permit_wait_seconds}}]}]}

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        cfg = self.workdir / "coscheduling-config.yaml"
        cfg.write_text(yaml.safe_dump(self.config(plane.kubeconfig, qps, burst)))
        self._spawn(plane, "coscheduling-controller", [
            self._bin("controller"), f"--qps={qps}", f"--burst={burst}",
            "--enableLeaderElection=false", "--metricsAddr=0", "--probeAddr=0"],
            {"KUBECONFIG": str(plane.kubeconfig)})
        self._spawn(plane, "coscheduling-scheduler", [
            self._bin("kube-scheduler"), f"--config={cfg}", "--secure-port=0",
            "--profiling=false"])

    def group(self, name: str, size: int) -> tuple[str, str, str, Obj] | None:
        return ("scheduling.x-k8s.io", "v1alpha1", "podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name}, "spec": {"minMember": size}})

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        return base_pod(name, self.scheduler_name, gpus,
                        labels={"scheduling.x-k8s.io/pod-group": gang} if gang else None)


@dataclass
class YuniKorn(Peer):
    """Apache YuniKorn (the k8shim binary): configured by a ConfigMap (queues, and the client
    rate limit as kubernetes.qps/burst); it has no leader election. A gang is an application
    with a task group: YuniKorn first binds placeholder pods, then swaps the real ones in."""

    key: ClassVar[str] = "yunikorn"
    scheduler_name: ClassVar[str] = "yunikorn"
    build_name: ClassVar[str | None] = "yunikorn"
    config_namespace: str = "yunikorn"

    def install(self, plane: ControlPlane, namespace: str) -> None:
        _ensure_namespace(plane, self.config_namespace)

    def configmap(self, qps: int, burst: int) -> Obj:
        queues = {"partitions": [{
            "name": "default",
            "placementrules": [{"name": "provided", "create": False}],
            "queues": [{"name": "root", "submitacl": "*",
                        "queues": [{"name": QUEUE, "submitacl": "*"}]}]}]}
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "yunikorn-configs"},
                "data": {"kubernetes.qps": str(qps), "kubernetes.burst": str(burst),
                         "queues.yaml": yaml.safe_dump(queues)}}

    def start(self, plane: ControlPlane, qps: int, burst: int) -> None:
        core = client.CoreV1Api(plane.api_client())
        body = self.configmap(qps, burst)
        try:
            core.create_namespaced_config_map(self.config_namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise
            core.replace_namespaced_config_map("yunikorn-configs", self.config_namespace, body)
        # its REST service always listens on :9080 (not configurable)
        self._spawn(plane, "yunikorn-scheduler", [self._bin("yunikorn-scheduler")],
                    {"KUBECONFIG": str(plane.kubeconfig), "NAMESPACE": self.config_namespace})

    def pod(self, name: str, gang: str | None, size: int, gpus: int = 0) -> Obj:
        labels = {"yunikorn.apache.org/queue": f"root.{QUEUE}"}
        if gang is None:  # no app id: YuniKorn puts it in the namespace's generated application
            return base_pod(name, self.scheduler_name, gpus, labels=labels)
        resources: Obj = {"cpu": "100m", "memory": "128Mi"}
        if gpus:
            resources["nvidia.com/gpu"] = str(gpus)
        groups = [{"name": "workers", "minMember": size, "minResource": resources}]
        return base_pod(name, self.scheduler_name, gpus,
                        labels={**labels, "yunikorn.apache.org/app-id": gang},
                        annotations={"yunikorn.apache.org/task-group-name": "workers",
                                     "yunikorn.apache.org/task-groups": json.dumps(groups)})

    def is_own_pod(self, pod: Obj) -> bool:
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        return not ({"internal.yunikorn.apache.org/placeholder", "yunikorn.apache.org/placeholder"}
                    & set(ann))


def _ensure_namespace(plane: ControlPlane, name: str) -> None:
    try:
        client.CoreV1Api(plane.api_client()).create_namespace({"metadata": {"name": name}})
    except ApiException as e:
        if e.status != 409:
            raise


PEERS: dict[str, type[Peer]] = {p.key: p for p in (
    KaiRay, KubeScheduler, KaiScheduler, Volcano, Coscheduling, YuniKorn)}


def make(key: str) -> Peer:
    try:
        return PEERS[key]()
    except KeyError:
        raise ValueError(f"unknown scheduler {key!r}: one of {', '.join(PEERS)}") from None
