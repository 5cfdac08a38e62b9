"""The real KubeRay operator on the session plane: KubeRay's kai samples, unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kai_ray.testing import binaries
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.plane import Component

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(180)]

QUEUE_API = ("scheduling.run.ai", "v2", "queues")


@pytest.fixture
def sample_queues(cluster: Cluster) -> Iterator[None]:
    """The samples' Queues are cluster-scoped: remove the ones this test added."""
    api = client.CustomObjectsApi(cluster.api_client())
    before = {q["metadata"]["name"] for q in api.list_cluster_custom_object(*QUEUE_API)["items"]}
    yield
    for q in api.list_cluster_custom_object(*QUEUE_API)["items"]:
        if q["metadata"]["name"] not in before:
            api.delete_cluster_custom_object(*QUEUE_API, q["metadata"]["name"])


def ray_pods(core: client.CoreV1Api, namespace: str, cluster_name: str, want: int,
             timeout: float = 60.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    pods: list[Any] = []
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"ray.io/cluster={cluster_name}").items
        if len(pods) >= want:
            return pods
        time.sleep(0.2)
    pytest.fail(f"KubeRay created {len(pods)} of {want} pods for {cluster_name} in {timeout:.0f}s")


def test_gpu_sharing_sample_gets_kai_scheduler_pods_with_fraction_annotation(
        cluster: Cluster, kuberay_operator: Component | None, namespace: str,
        sample_queues: None) -> None:
    sample = binaries.kuberay_sample("ray-cluster.kai-gpu-sharing.yaml")
    cluster.kubectl("apply", "-n", namespace, "-f", str(sample))
    core = client.CoreV1Api(cluster.api_client())
    pods = ray_pods(core, namespace, "raycluster-half-gpu", 3)
    assert len(pods) == 3
    for pod in pods:
        assert pod.spec.scheduler_name == "kai-scheduler"
        assert pod.metadata.labels["kai.scheduler/queue"] == "team-a"
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    assert len(workers) == 2
    assert all(p.metadata.annotations.get("gpu-fraction") == "0.5" for p in workers)
