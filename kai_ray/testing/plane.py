"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, KWOK.

Everything listens on 127.0.0.1 on free ports, with generated certificates; no Docker, no
kubelet. KWOK plays the kubelet for the nodes it manages (see kwok-stages.yaml).

    with ControlPlane() as plane:
        plane.add_gpu_nodes(2, gpus_per_node=8)
        ...

With `real_node=True` the API server listens on the real node's bridge address instead, so
that pods reach it (realnode.py: RealNode runs a real kubelet beside the KWOK nodes).

Attached planes (the default) die with the Python process that started them; `detached=True`
planes outlive it and are stopped later from their saved `state()` (the dev cluster).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kai_ray.testing import binaries, procs, realnode
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.pki import Pki, issue_cert, write_kubeconfig, write_pki

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
NODE_LEASE_SECONDS = 40


class ControlPlaneError(RuntimeError):
    """A component failed to start or stop; the message holds the end of its log."""


@dataclass
class Component:
    """One running binary; pid is also its process-group id (each runs in its own session)."""

    name: str
    pid: int
    log: Path
    binary: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        # not our child (dev cluster): make sure the pid was not reused by something else
        argv = procs.cmdline(self.pid)
        return bool(argv) and Path(argv[0]).name == Path(self.binary).name


class ControlPlane(Cluster):
    """etcd + kube-apiserver (+ kube-controller-manager, + KWOK) as local child processes."""

    def __init__(self, workdir: Path | None = None, *, detached: bool = False,
                 controller_manager: bool = True, kwok: bool = True,
                 kube_scheduler: bool = False, keep_workdir: bool = False,
                 real_node: bool = False, profiling: bool = False) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kai-ray-plane-"))
        super().__init__(self.workdir / "kubeconfig")
        self.detached = detached
        self.with_controller_manager = controller_manager
        self.with_kwok = kwok
        # the stock scheduler serves `default-scheduler` pods only: a baseline for benchmarks
        self.with_kube_scheduler = kube_scheduler
        self.keep_workdir = keep_workdir
        # room for a realnode.RealNode: the API server listens on the pods' bridge (which the
        # plane creates) so pods reach it, authorizes kubelets (Node) and calls them with TLS
        self.real_node = real_node
        # the API server's /debug/pprof (benchmarks: where its CPU goes); off otherwise
        self.profiling = profiling
        self._owns_bridge = False  # the bridge was made by this plane (else: not ours to undo)
        self.components: dict[str, Component] = {}
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self._pki: Pki | None = None
        self._atexit_registered = False

    # -- public -------------------------------------------------------------------------------
    @property
    def api_host(self) -> str:
        return realnode.GATEWAY if self.real_node else "127.0.0.1"

    @property
    def api_url(self) -> str:
        return f"https://{self.api_host}:{self.ports['apiserver']}"

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("the plane's PKI exists once it has started")
        return self._pki

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    def start(self, timeout: float = 90.0, attempts: int = 2) -> ControlPlane:
        """Start every component and install kai-ray's CRDs; returns when all are usable.

        Ports are picked free just before use; if another process takes one first, the start is
        retried with new ports. On failure the processes are stopped and the logs kept.
        """
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except ControlPlaneError as e:
                self._stop_processes()
                if attempt < attempts and "address already in use" in str(e):
                    continue
                self.keep_workdir = True  # the logs are the diagnosis
                raise ControlPlaneError(f"{e}\n(all logs in {self.logs_dir})") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> ControlPlane:
        t0 = time.monotonic()
        deadline = t0 + timeout
        bins = binaries.require(*self._binary_names())
        if not self.detached and not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        self._prepare_files()
        self._start_etcd(bins["etcd"])
        self._start_apiserver(bins["kube-apiserver"])
        self._wait_apiserver_ready(deadline)
        self.timings["apiserver_ready"] = time.monotonic() - t0
        if self.with_controller_manager:
            self._start_controller_manager(bins["kube-controller-manager"])
        if self.with_kwok:
            self._start_kwok(bins["kwok"])
            # KWOK nodes run no containers: this plays their reservation pods' GPU reports
            self._spawn("kwok-gpu-reporter", [
                sys.executable, "-m", "kai_ray.testing.devices",
                f"--kubeconfig={self.kubeconfig}"])
        if self.with_kube_scheduler:
            self._spawn("kube-scheduler", [
                str(bins["kube-scheduler"]), f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false", "--secure-port=0", "--profiling=false"])
        try:
            self.install_crds(timeout=max(1.0, deadline - time.monotonic()))
            self.timings["crds_ready"] = time.monotonic() - t0
            if self.with_controller_manager:
                # the first namespace's ServiceAccount proves the controllers are running
                self.wait_service_account("default",
                                          timeout=max(1.0, deadline - time.monotonic()))
        except Exception as e:
            self._check_alive()  # a component that died explains it best
            raise ControlPlaneError(str(e)) from e
        self._check_alive()
        self.timings["ready"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop every component (process groups, SIGTERM then SIGKILL); idempotent."""
        self._stop_processes()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_processes(self) -> None:
        if self._owns_bridge:  # its pods, mounts, cgroups, chains first, while containerd runs
            realnode.RealNode(self).stop()
        # clients of the API server first, etcd last
        order = ["ray-operator", "kube-scheduler", "kwok-gpu-reporter", "kwok",
                 "kube-controller-manager",
                 "kube-apiserver", "etcd"]
        names = sorted(self.components, key=lambda n: order.index(n) if n in order else -1)
        for name in names:
            comp = self.components[name]
            if comp.proc is not None or comp.alive():
                procs.stop_group(comp.pid, proc=comp.proc)
        self.components.clear()
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
            self._api = None
        if self._owns_bridge:
            realnode.remove_bridge()
            self._owns_bridge = False

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_component(self, name: str, argv: list[str]) -> Component:
        """Start another process with the plane's lifetime rules (used for KubeRay)."""
        log = self.logs_dir / f"{name}.log"
        proc = procs.spawn(argv, log, detached=self.detached)
        comp = Component(name, proc.pid, log, argv[0], proc)
        self.components[name] = comp
        return comp

    def state(self) -> dict[str, Any]:
        """What a later process needs to find and stop this plane (JSON-serialisable)."""
        return {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "api_url": self.api_url,
            "ports": self.ports,
            "real_node": self.real_node,
            "components": {n: {"pid": c.pid, "log": str(c.log), "binary": c.binary}
                           for n, c in self.components.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ControlPlane:
        """Re-attach to a detached plane (to inspect or stop it)."""
        plane = cls(Path(state["workdir"]), detached=True,
                    real_node=bool(state.get("real_node")))
        plane._owns_bridge = plane.real_node  # the dev cluster's plane made it
        plane.ports = {k: int(v) for k, v in state["ports"].items()}
        for name, c in state["components"].items():
            plane.components[name] = Component(name, int(c["pid"]), Path(c["log"]), c["binary"])
        return plane

    def check_alive(self) -> dict[str, bool]:
        """Which components are still running."""
        return {n: c.alive() for n, c in self.components.items()}

    # -- internals ----------------------------------------------------------------------------
    def _binary_names(self) -> list[str]:
        names = ["etcd", "kube-apiserver"]
        if self.with_controller_manager:
            names.append("kube-controller-manager")
        if self.with_kwok:
            names.append("kwok")
        if self.with_kube_scheduler:
            names.append("kube-scheduler")
        return names

    def _prepare_files(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        names = ["etcd", "etcd_peer", "apiserver"]
        self.ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
        if self.real_node and not self._owns_bridge:
            realnode.ensure_bridge()  # the API server binds the bridge's address
            self._owns_bridge = True
        self._pki = write_pki(self.workdir / "pki",
                              extra_ips=[realnode.GATEWAY] if self.real_node else [])
        if self.real_node:  # the API server's identity towards the kubelet
            issue_cert(self._pki, self.workdir / "pki", "apiserver-kubelet-client",
                       "kube-apiserver-kubelet-client", org="system:masters")
        write_kubeconfig(self.kubeconfig, self.api_url, self._pki)
        stages = resources.files("kai_ray.testing").joinpath("kwok-stages.yaml").read_text()
        (self.workdir / "kwok-stages.yaml").write_text(stages)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.add_component(name, argv)

    def _check_alive(self) -> None:
        for comp in self.components.values():
            if not comp.alive():
                raise ControlPlaneError(
                    f"{comp.name} exited during start-up; end of {comp.log}:\n"
                    f"{procs.tail(comp.log)}")

    def _start_etcd(self, binary: Path) -> None:
        client_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        self._spawn("etcd", [
            str(binary),
            "--name=kai-ray",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kai-ray={peer_url}",
            "--initial-cluster-state=new",
            # a throw-away store: skipping fsync makes every write (and the start) much faster
            "--unsafe-no-fsync",
            "--log-level=warn",
        ])

    def _start_apiserver(self, binary: Path) -> None:
        assert self._pki is not None
        p = self._pki
        self._spawn("kube-apiserver", [
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--bind-address={self.api_host}",
            f"--advertise-address={self.api_host}",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            *(self._real_node_apiserver_flags() if self.real_node else [
                "--authorization-mode=RBAC",
                # a loopback address may not be published as the `kubernetes` Service's endpoint
                "--endpoint-reconciler-type=none"]),
            # API priority and fairness: its start-up hooks and config objects only cost time here
            "--enable-priority-and-fairness=false",
            f"--profiling={'true' if self.profiling else 'false'}",
            "--v=0",
        ])

    def _real_node_apiserver_flags(self) -> list[str]:
        """A real kubelet: Node authorization, TLS both ways, and the `kubernetes` Service's
        endpoint kept (the bridge address), so pods reach the API server."""
        pki_dir = self.workdir / "pki"
        return [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki_dir / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki_dir / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={self.pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]

    def _start_controller_manager(self, binary: Path) -> None:
        assert self._pki is not None
        p = self._pki
        self._spawn("kube-controller-manager", [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",  # no health endpoint needed; avoids a port
            f"--service-account-private-key-file={p.sa_key}",
            f"--root-ca-file={p.ca_cert}",
            f"--cluster-signing-cert-file={p.ca_cert}",
            f"--cluster-signing-key-file={p.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=false",
            # its default client limit (20 QPS) lifts the not-ready taint of ~5 new nodes a
            # second: 1,000 KWOK nodes took 224 s to become schedulable
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
            "--v=0",
        ])

    def _start_kwok(self, binary: Path) -> None:
        self._spawn("kwok", [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.workdir / 'kwok-stages.yaml'}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--cidr={POD_CIDR}",
        ])

    def _wait_apiserver_ready(self, deadline: float) -> None:
        assert self._pki is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        ctx.load_cert_chain(str(self._pki.admin_cert), str(self._pki.admin_key))
        last = "no answer yet"
        while time.monotonic() < deadline:
            self._check_alive()
            problem = procs.probe_readyz(http.client.HTTPSConnection(
                self.api_host, self.ports["apiserver"], context=ctx, timeout=2))
            if problem is None:
                return
            last = problem
            time.sleep(0.1)
        raise ControlPlaneError(
            f"kube-apiserver not ready ({last}); end of its log:\n"
            f"{procs.tail(self.logs_dir / 'kube-apiserver.log')}")


def save_state(plane: ControlPlane, path: Path, **extra: Any) -> None:
    path.write_text(json.dumps({**plane.state(), **extra}, indent=2))
