"""The real KubeRay operator (built from its Go module) against a local control plane."""

from __future__ import annotations

import http.client
import time

from kubernetes import client

from kai_ray.testing import binaries, procs
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.plane import Component, ControlPlane, ControlPlaneError

KUBERAY_CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")
_BATCH_SCHEDULER: dict[int, str] = {}  # id(plane) -> its operator's --batch-scheduler


def install_kuberay_crds(cluster: Cluster, timeout: float = 90.0) -> list[str]:
    """Create the CRDs the operator needs (RayCluster, RayJob, RayService) where missing.

    They are 0.7-1.4 MB each: too big for client-side apply, and `create` is cheaper than a
    server-side apply. RayCronJob is left out: the operator only watches it behind a feature gate.
    """
    ext = client.ApiextensionsV1Api(cluster.api_client())
    have = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    by_name = {f.name.removeprefix("ray.io_").removesuffix(".yaml") + ".ray.io": f
               for f in binaries.kuberay_crds()}
    missing = [n for n in KUBERAY_CRDS if n not in have]
    if missing:
        args = ["create"]
        for name in missing:
            args += ["-f", str(by_name[name])]
        cluster.kubectl(*args, timeout=timeout)
    cluster.wait_crds_established(KUBERAY_CRDS, timeout)
    return list(KUBERAY_CRDS)


def start_kuberay_operator(plane: ControlPlane, *, batch_scheduler: str = "kai-scheduler",
                           timeout: float = 60.0) -> Component:
    """Install KubeRay's CRDs and start its operator; returns once it reports ready. A plane
    whose operator already runs gets that one back.

    Leader election is off (no namespace to hold the lease out of cluster), metrics are off, and
    the health probe listens on a free loopback port that readiness is read from.
    """
    running = plane.components.get("ray-operator")
    if running is not None and running.alive():
        # one per plane: a second operator would reconcile every RayCluster twice (duplicate
        # pods, deleted ones); tests sharing a session plane each ask for it
        if _BATCH_SCHEDULER.get(id(plane)) != batch_scheduler:
            raise ControlPlaneError(f"the plane's KubeRay operator runs with --batch-scheduler="
                                    f"{_BATCH_SCHEDULER.get(id(plane))}, not {batch_scheduler}")
        return running
    binary = binaries.require("ray-operator")["ray-operator"]
    install_kuberay_crds(plane, timeout)
    probe_port = procs.free_ports(1)[0]
    plane.ports["ray-operator-probe"] = probe_port
    comp = plane.add_component("ray-operator", [
        str(binary),
        f"--kubeconfig={plane.kubeconfig}",
        f"--batch-scheduler={batch_scheduler}",
        "--enable-leader-election=false",
        "--metrics-addr=0",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--log-stdout-encoder=console",
    ])
    _wait_ready(comp, probe_port, timeout)
    _BATCH_SCHEDULER[id(plane)] = batch_scheduler
    return comp


def _wait_ready(comp: Component, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not comp.alive():
            raise ControlPlaneError(
                f"ray-operator exited; end of {comp.log}:\n{procs.tail(comp.log)}")
        problem = procs.probe_readyz(http.client.HTTPConnection("127.0.0.1", port, timeout=2))
        if problem is None:
            return
        last = problem
        time.sleep(0.1)
    raise ControlPlaneError(
        f"ray-operator not ready after {timeout:.0f}s ({last}); end of {comp.log}:\n"
        f"{procs.tail(comp.log)}")
