"""Fixtures for tests against a real control plane.

`cluster` is session-scoped: by default a local ControlPlane (etcd, kube-apiserver,
kube-controller-manager, KWOK) built by tools/cluster/build.sh; with KAI_RAY_TEST_KUBECONFIG set,
an existing cluster (kind, a real one) instead. `namespace` is a fresh namespace per test.
`real_node` is a plane of its own with a real kubelet node (marker `realnode`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s.crds import crd_manifests
from kai_ray.testing import binaries
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.plane import Component, ControlPlane
from kai_ray.testing.realnode import RealNode
from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.chart_rbac import ChartScheduler, install_scheduler_rbac

GPU_NODES = 2
GPUS_PER_NODE = 8


def _require_binaries(*names: str) -> None:
    try:
        binaries.require(*names)
    except binaries.BinariesMissing as e:
        if os.environ.get("KAI_RAY_SKIP_BINARIES"):
            pytest.skip(f"control-plane binaries not built (KAI_RAY_SKIP_BINARIES set): {e}")
        pytest.fail(f"control-plane binaries missing; run tools/cluster/build.sh: {e}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster every integration test talks to, with kai-ray's CRDs installed."""
    kubeconfig = os.environ.get("KAI_RAY_TEST_KUBECONFIG")
    if kubeconfig:
        existing = Cluster(Path(kubeconfig))
        # keep CRDs an installation already has (KAI's own, a chart's); add only missing ones
        ext = client.ApiextensionsV1Api(existing.api_client())
        have = {c.metadata.name for c in ext.list_custom_resource_definition().items}
        existing.install_crds([m for m in crd_manifests() if m["metadata"]["name"] not in have])
        yield existing
        return
    _require_binaries(*binaries.CONTROL_PLANE)
    plane = ControlPlane()
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """A local control plane of the test module's own, for tests whose scheduler (its config,
    its crashes) must not meet the shared `cluster`'s."""
    _require_binaries(*binaries.CONTROL_PLANE)
    with ControlPlane() as p:
        yield p


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster) -> list[str]:
    """KWOK GPU nodes (needs a KWOK controller; the local plane runs one)."""
    return cluster.add_gpu_nodes(GPU_NODES, GPUS_PER_NODE)


@pytest.fixture(scope="session")
def kuberay_operator(cluster: Cluster) -> Component | None:
    """The real KubeRay operator (--batch-scheduler=kai-scheduler) watching `cluster`.

    On the local plane it is started here (its CRDs installed first); an existing cluster must
    already run KubeRay with that flag (None is returned then).
    """
    if not isinstance(cluster, ControlPlane):
        ext = client.ApiextensionsV1Api(cluster.api_client())
        if "rayclusters.ray.io" not in {c.metadata.name for c in
                                        ext.list_custom_resource_definition().items}:
            pytest.skip("KAI_RAY_TEST_KUBECONFIG cluster has no KubeRay installed")
        return None
    _require_binaries("ray-operator", "kubectl")
    return start_kuberay_operator(cluster)


@pytest.fixture
def core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client())


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), deleted after the test."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace({"metadata": {"name": name, "labels": {"kai-ray.io/test": "true"}}})
    cluster.wait_service_account(name)
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="session")
def chart_scheduler(cluster: Cluster,
                    tmp_path_factory: pytest.TempPathFactory) -> ChartScheduler:
    """The chart's ServiceAccounts, scheduler RBAC, reservation namespace and scheduler config
    applied to the cluster (`helm template`, nothing granted besides), and the scheduler's
    token. Release `kai-ray` in kube-system: the Lease is then where `kai-ray run` puts it by
    default, so a second, admin `kai-ray run` of a test contends for the same one."""
    _require_binaries("helm", "kubectl")
    return install_scheduler_rbac(cluster, tmp_path_factory.mktemp("chart-scheduler"))


@pytest.fixture(scope="session")
def kai_scheduler(cluster: Cluster, request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[KaiRayProcess]:
    """`kai-ray run` as its own process against the cluster (killed at the end), as the
    chart's scheduler Deployment runs it: its ServiceAccount's token and RBAC, its config and
    Lease. A call the chart does not allow fails here too."""
    if os.environ.get("KAI_RAY_TEST_INCLUSTER"):
        # kai-ray installed in the cluster by its chart (docs/install.md): the tests run
        # against its pod, under exactly the chart's RBAC (KAI_RAY_TEST_KUBECONFIG names it)
        from kai_ray.testing.install import InClusterScheduler

        in_cluster = InClusterScheduler(cluster.kubeconfig)
        in_cluster.wait_ready()
        yield in_cluster  # type: ignore[misc]
        return
    chart_scheduler: ChartScheduler = request.getfixturevalue("chart_scheduler")
    proc = KaiRayProcess(chart_scheduler.kubeconfig, tmp_path_factory.mktemp("kai-ray-run"),
                         extra_args=chart_scheduler.args)
    proc.start()
    proc.wait_ready()
    yield proc
    proc.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The real node's tests run last, so its processes do not load the machine while the other
    # tests run; its teardown tests (they stop the session's node) after all of them.
    def last(item: pytest.Item) -> tuple[bool, bool]:
        return (item.get_closest_marker("realnode") is not None,
                item.get_closest_marker("realnode_teardown") is not None)

    items.sort(key=last)


@pytest.fixture(scope="session")
def real_node_host_before() -> dict[str, object]:
    """The host's state before the real node's plane starts (the teardown test compares)."""
    from kai_ray.testing import realnode

    return realnode.host_snapshot()


@pytest.fixture(scope="session")
def real_node(real_node_host_before: dict[str, object]) -> Iterator[RealNode]:
    """A real kubelet node (containerd, CNI bridge, kube-proxy, CoreDNS, 2 fake GPUs) in a
    ControlPlane(real_node=True) of its own, with the busybox and debian-python images."""
    from kai_ray.testing import images

    if os.geteuid() != 0:
        pytest.skip("the real node needs root")
    _require_binaries(*binaries.CONTROL_PLANE)
    try:
        binaries.require_node()
    except binaries.BinariesMissing as e:
        if os.environ.get("KAI_RAY_SKIP_BINARIES"):
            pytest.skip(f"real-node binaries not built (KAI_RAY_SKIP_BINARIES set): {e}")
        pytest.fail(f"real-node binaries missing; run tools/cluster/build.sh: {e}")
    plane = ControlPlane(real_node=True, kube_scheduler=True)  # runs the chart's own pods
    plane.start()
    try:
        node = RealNode(plane, gpus=2).start()
        for image in ("busybox", "debian-python"):
            node.import_image(images.ensure(image))
        yield node
    finally:
        plane.stop()
