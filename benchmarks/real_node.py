"""The real kubelet node: how long it takes to start, and how long a fractional pod takes from
`kubectl apply` to Running on it, with kai-ray scheduling and kai-ray's reservation image.

    sudo PYTHONPATH=. python3 benchmarks/real_node.py [--runs 3]

Each run starts a fresh plane (etcd, kube-apiserver, controller-manager, KWOK) with a real node
(containerd, kubelet, fake GPU device plugin, kube-proxy, CoreDNS), imports the images (built
and cached by kai_ray.testing.images; built first if missing), starts `kai-ray run --webhook`,
then creates:
  - `first`:  a gpu-fraction 0.5 pod on a device nobody shares yet (a reservation pod is
              created, started, and reports the device before the pod can bind);
  - `second`: a gpu-fraction 0.3 pod that joins that device (its reservation pod already runs).
Prints seconds per phase; `stop` is the node's and the plane's teardown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from kubernetes import client

from kai_ray.testing import images
from kai_ray.testing.plane import ControlPlane
from kai_ray.testing.realnode import RealNode
from kai_ray.testing.scheduler_process import KaiRayProcess

QUEUE = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "bench"},
         "spec": {"resources": {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                                for r in ("cpu", "gpu", "memory")}}}


def _pod(name: str, fraction: str, image: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "labels": {"kai.scheduler/queue": "bench"},
        "annotations": {"gpu-fraction": fraction}},
        "spec": {"schedulerName": "kai-scheduler", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "command": ["sleep", "3600"]}]}}


def _until_running(core: client.CoreV1Api, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, "default")
        if pod.status.phase == "Running":
            return
        time.sleep(0.05)
    raise TimeoutError(f"pod {name} not Running after {timeout:.0f}s")


def one_run(work: Path) -> dict[str, float]:
    t: dict[str, float] = {}
    plane = ControlPlane(real_node=True)
    t0 = time.monotonic()
    plane.start()
    try:
        t["plane_ready"] = time.monotonic() - t0
        node = RealNode(plane).start()
        t["node_ready (kubelet start -> Ready)"] = plane.timings["node_ready"]
        t["node_started (containerd .. DNS)"] = plane.timings["node_started"]
        for name in ("busybox", "kai-ray-reservation"):
            s = time.monotonic()
            node.import_image(images.ensure(name))
            t[f"import {name}"] = time.monotonic() - s
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump({"reservation": {
            "image": images.ensure("kai-ray-reservation").ref}}))
        proc = KaiRayProcess(plane.kubeconfig, work, extra_args=["--config", str(config),
                                                                  "--webhook"])
        proc.start()
        try:
            proc.wait_ready()
            api = plane.api_client()
            client.CustomObjectsApi(api).create_cluster_custom_object(
                "scheduling.run.ai", "v2", "queues", QUEUE)
            core = client.CoreV1Api(api)
            busybox = images.ensure("busybox").ref
            for name, fraction in (("first", "0.5"), ("second", "0.3")):
                s = time.monotonic()
                core.create_namespaced_pod("default", _pod(name, fraction, busybox))
                _until_running(core, name)
                t[f"apply -> Running: {name} ({fraction})"] = time.monotonic() - s
        finally:
            proc.stop()
        s = time.monotonic()
    finally:
        plane.stop()  # the node's teardown is part of the plane's stop
    t["stop"] = time.monotonic() - s
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for name in ("busybox", "kai-ray-reservation"):
        images.ensure(name)  # built outside the timed runs
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as work:
            runs.append(one_run(Path(work)))
        print(f"run {i + 1}/{args.runs}: " + ", ".join(f"{k} {v:.2f}"
                                                      for k, v in runs[-1].items()),
              file=sys.stderr, flush=True)
    print(f"{'phase':<42} {'median':>7} {'min':>7} {'max':>7}")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"{key:<42} {statistics.median(values):7.2f} {min(values):7.2f} "
              f"{max(values):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
