"""Real Ray with its autoscaler on the real kubelet node: the KubeRay operator (batch scheduler
kai-scheduler) runs a RayCluster with in-tree autoscaling, a Ray job submitted from this machine
asks for more one-GPU workers than the node's 2 fake GPUs, Ray's autoscaler sidecar raises the
worker group's replicas, kai-ray places what fits and nothing else, and after the job the
autoscaler's scale-down (workersToDelete) removes exactly the pods it names.

The scenario and its measurements live in kai_ray.testing.ray_autoscale_bench, which also runs
stand-alone and writes benchmarks/results/real_ray_autoscaler.json."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.testing import images
from kai_ray.testing import ray_autoscale_bench as bench
from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.realnode import RealNode
from tests.integration.helpers import install_chart_for_tests

pytestmark = [pytest.mark.integration, pytest.mark.realnode, pytest.mark.kuberay,
              pytest.mark.timeout(1500)]
GPUS = 2  # the real node's fake devices (conftest's real_node)
MAX_REPLICAS = 3
TASKS = 3


@pytest.fixture(scope="module")
def kuberay(real_node: RealNode) -> None:
    start_kuberay_operator(real_node.plane)  # the plane's one operator


@pytest.fixture(scope="module")
def scheduler(real_node: RealNode) -> Iterator[Callable[[], str]]:
    """kai-ray, the scheduler under test, as users run it: installed in the real node's plane by
    `helm install` of this checkout's chart (its image, its ServiceAccounts; the scheduler and
    webhook run as pods on the real node). Yields the end of the scheduler pod's log, for
    failure messages."""
    chart = install_chart_for_tests(real_node)
    yield lambda: chart.logs("scheduler", tail=200)
    chart.uninstall()


@pytest.fixture(scope="module")
def ray_image(real_node: RealNode) -> str:
    image = images.ensure("kai-ray-ray")
    real_node.import_image(image)
    return image.ref


@pytest.fixture(scope="module")
def ray_queue(real_node: RealNode) -> Iterator[str]:
    bench.ensure_queue(real_node.plane)
    yield bench.QUEUE
    try:
        client.CustomObjectsApi(real_node.plane.api_client()).delete_cluster_custom_object(
            *bench.QUEUE_API, bench.QUEUE)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.mark.usefixtures("kuberay")
# minReplicas 0: the gang is the head alone; every worker is elastic. It depends on kai-ray's
# pod grouper keeping the gang minimum at minReplicas under in-tree autoscaling (KAI's rule
# counts `replicas` when minReplicas is 0: the autoscaler's replicas=3 would make a gang of 4
# that never fits 2 GPUs, place no worker, and evict the running head as a stale gang).
@pytest.mark.parametrize("min_replicas", [1, 0])
def test_ray_autoscaler_gets_the_gpu_workers_that_fit_and_scales_down_exactly_the_named(
        real_node: RealNode, scheduler: Callable[[], str], ray_image: str, ray_queue: str,
        min_replicas: int, tmp_path: Path) -> None:
    plane = real_node.plane
    namespace = f"ray-autoscale-min{min_replicas}-{uuid.uuid4().hex[:5]}"
    bench.wait_gpus_free(plane)
    bench.create_namespace(plane, namespace)
    try:
        sc = bench.run_scenario(plane, image=ray_image, min_replicas=min_replicas,
                                namespace=namespace, queue=ray_queue, gpus=GPUS, tasks=TASKS,
                                scheduler_log=scheduler)
    except bench.ScenarioFailed as e:
        print("\n" + bench.summary(e.scenario))  # what it measured up to there
        raise
    finally:
        bench.delete_ray_cluster(plane, namespace)
        client.CoreV1Api(plane.api_client()).delete_namespace(namespace)
    print("\n" + bench.summary(sc))
    (tmp_path / "autoscaler.log").write_text(sc.autoscaler_log)
    print(f"autoscaler sidecar log: {tmp_path / 'autoscaler.log'}")
    detail = sc.as_dict()

    # the autoscaler asked for every worker the job wanted (3 in all), as JSON patches on the
    # RayCluster's replicas, and KubeRay created them
    assert max(r for _, r in sc.recorder.replicas) == MAX_REPLICAS, detail["replicas"]
    new = sc.new_workers()
    assert len(new) == MAX_REPLICAS - min_replicas, detail["pods"]

    # kai-ray placed the ones that fit the node's 2 GPUs; the one left waited with kai-ray's
    # reason, not merely Pending
    fits = GPUS - min_replicas
    placed_at_once = sorted(p.running for p in new if p.running)[:fits]
    assert len(placed_at_once) == fits, detail["pods"]
    waiting = [p for p in new if p.unschedulable is not None]
    assert waiting, detail["pods"]
    for p in waiting:
        assert p.unschedulable_reason == "Unschedulable" and p.unschedulable_message, p
        # it waited while the placed workers ran, for want of a GPU
        assert p.bound is None or p.bound > placed_at_once[-1], p

    # the job ran all 3 tasks on the workers, never more at once than there were GPUs: the third
    # ran when one of the first two ended
    assert sc.job_status == "SUCCEEDED", sc.job_log_tail
    tasks = sorted(sc.job_results, key=lambda r: r["start"])
    assert len(tasks) == TASKS, sc.job_log_tail
    workers = {p.name for p in sc.pods() if p.kind == "worker"}
    assert {t["host"] for t in tasks} <= workers, (tasks, workers)
    assert all(t["device"] and t["device"].startswith("GPU-") for t in tasks), tasks
    assert sc.max_concurrent_tasks() == GPUS, tasks

    # nothing running was evicted or restarted, the head included; the pods deleted are exactly
    # the ones the autoscaler named in workersToDelete, and the group is back at minReplicas
    assert sc.violations() == [], detail
    named = set(sc.named_for_deletion())
    assert {p.name for p in sc.deleted()} == named, (named, detail["pods"])
    assert len(sc.recorder.live("worker")) == min_replicas
    assert sc.measurements()["job_end_to_scaled_down_s"] is not None
