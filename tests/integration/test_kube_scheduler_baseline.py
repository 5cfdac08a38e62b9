"""The stock kube-scheduler (benchmark baseline) on its own plane: it binds default-scheduler
pods to KWOK GPU nodes and leaves kai-scheduler pods alone."""

from __future__ import annotations

import os
import time

import pytest
from kubernetes import client

from kai_ray.testing import binaries
from kai_ray.testing.plane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _pod(name: str, scheduler: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "example.invalid/x:1",
                        "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def test_kube_scheduler_binds_default_pods_only() -> None:
    if os.environ.get("KAI_RAY_TEST_KUBECONFIG"):
        pytest.skip("starts its own local plane")
    try:
        binaries.require(*binaries.CONTROL_PLANE, "kube-scheduler")
    except binaries.BinariesMissing as e:
        pytest.fail(f"run tools/cluster/build.sh first: {e}")
    with ControlPlane(kube_scheduler=True) as plane:
        plane.add_gpu_nodes(1, 8)
        core = client.CoreV1Api(plane.api_client())
        plane.wait_service_account("default")
        core.create_namespaced_pod("default", _pod("stock", "default-scheduler"))
        core.create_namespaced_pod("default", _pod("kai", "kai-scheduler"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if core.read_namespaced_pod("stock", "default").status.phase == "Running":
                break
            time.sleep(0.2)
        stock = core.read_namespaced_pod("stock", "default")
        assert stock.status.phase == "Running", stock.status
        assert stock.spec.node_name == "kwok-gpu-0"
        assert core.read_namespaced_pod("kai", "default").spec.node_name is None
