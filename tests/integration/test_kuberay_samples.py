"""KubeRay's own kai samples, applied unchanged, run under kai-ray; so does kai-ray's
half-GPU recipe (num-gpus "1" for Ray, GPU_PORTION 0.50 for the memory cap)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kai_ray.testing import binaries
from kai_ray.testing.cluster import Cluster
from tests.integration.helpers import wait_for
from tests.integration.kuberay_helpers import describe, ray_pods, running

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(240)]
QUEUE_API = ("scheduling.run.ai", "v2", "queues")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sample_queues(cluster: Cluster) -> Iterator[None]:
    """The samples' Queues are cluster-scoped: remove the ones this test added."""
    api = client.CustomObjectsApi(cluster.api_client())
    before = {q["metadata"]["name"] for q in api.list_cluster_custom_object(*QUEUE_API)["items"]}
    yield
    for q in api.list_cluster_custom_object(*QUEUE_API)["items"]:
        if q["metadata"]["name"] not in before:
            api.delete_cluster_custom_object(*QUEUE_API, q["metadata"]["name"])


def _shared_env(core: client.CoreV1Api, namespace: str, pod: object) -> dict[str, str]:
    """The env the binder wrote for a fractional pod (its per-pod ConfigMap)."""
    prefix = pod.metadata.annotations["runai/shared-gpu-configmap"]  # type: ignore[attr-defined]
    cms = [c for c in core.list_namespaced_config_map(namespace).items
           if c.metadata.name.startswith(prefix)]
    assert len(cms) == 1, [c.metadata.name for c in cms]
    return dict(cms[0].data or {})


def _all_running(core: client.CoreV1Api, namespace: str, cluster: str, count: int) -> bool:
    pods = ray_pods(core, namespace, cluster)
    return len(pods) == count and len(running(pods)) == count


@pytest.mark.usefixtures("kuberay_operator", "gpu_nodes", "sample_queues")
def test_kuberay_kai_samples_run_unchanged_and_half_gpu_workers_share_a_device(
        cluster: Cluster, namespace: str, kai_scheduler) -> None:
    core = client.CoreV1Api(cluster.api_client())
    for sample in ("ray-cluster.kai-scheduler.yaml", "ray-cluster.kai-gpu-sharing.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(binaries.kuberay_sample(sample)))
    for name in ("raycluster-sample", "raycluster-half-gpu"):
        wait_for(f"{name}: head + 2 workers Running",
                 lambda n=name: _all_running(core, namespace, n, 3), timeout=90,
                 detail=lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail())

    workers = ray_pods(core, namespace, "raycluster-half-gpu", group="shared-gpu")
    assert len(workers) == 2
    groups = {(p.metadata.labels or {}).get("runai-gpu-group") for p in workers}
    assert len(groups) == 1 and None not in groups, groups
    assert workers[0].spec.node_name == workers[1].spec.node_name
    envs = [_shared_env(core, namespace, p) for p in workers]
    assert envs[0]["NVIDIA_VISIBLE_DEVICES"] == envs[1]["NVIDIA_VISIBLE_DEVICES"] != ""
    assert envs[0]["GPU_PORTION"] == envs[1]["GPU_PORTION"] == "0.50"
    # one PodGroup per RayCluster: head + 2 workers, both gangs
    for name in ("raycluster-sample", "raycluster-half-gpu"):
        pods = ray_pods(core, namespace, name)
        assert len({p.metadata.annotations["pod-group-name"] for p in pods}) == 1


@pytest.mark.usefixtures("kuberay_operator", "gpu_nodes", "sample_queues")
def test_half_gpu_recipe_ray_start_params_and_env_agree(cluster: Cluster, namespace: str,
                                                        kai_scheduler) -> None:
    """ray_samples/raycluster-gpu-fraction-capped.yaml: Ray is told one whole GPU per worker
    (`ray start --num-gpus` takes integers only) and the pod's env says it holds half of it,
    which the Ray-side helper turns into the memory cap."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    samples = ROOT / "ray_samples"
    for doc in yaml.safe_load_all((samples / "kai-queues.yaml").read_text()):
        try:
            custom.create_cluster_custom_object(*QUEUE_API, doc)
        except client.ApiException as e:
            assert e.status == 409
    cluster.kubectl("apply", "-n", namespace, "-f",
                    str(samples / "raycluster-gpu-fraction-capped.yaml"))
    name = "raycluster-half-gpu-capped"
    wait_for(f"{name} Running", lambda: _all_running(core, namespace, name, 3), timeout=90,
             detail=lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail())
    rc = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", name)
    group = rc["spec"]["workerGroupSpecs"][0]
    fraction = float(group["template"]["metadata"]["annotations"]["gpu-fraction"])
    ray_gpus = group["rayStartParams"]["num-gpus"]
    assert ray_gpus == "1" and 0 < fraction < 1
    for pod in ray_pods(core, namespace, name, group="shared-gpu"):
        env = _shared_env(core, namespace, pod)
        # the env the helper reads says: this one Ray GPU is `fraction` of a real device
        assert float(env["GPU_PORTION"]) == fraction
        assert env["NVIDIA_VISIBLE_DEVICES"]
        # KubeRay turns rayStartParams into the `ray start` command it runs (and records it
        # in KUBERAY_GEN_RAY_START_CMD): Ray sees exactly one whole GPU on this worker
        container = pod.spec.containers[0]
        cmd = next(e.value for e in container.env if e.name == "KUBERAY_GEN_RAY_START_CMD")
        assert re.findall(r"--num-gpus[= ](\S+)", cmd) == ["1"], cmd


# the gang each sample's comment promises: PodGroup minMember
SAMPLE_GANGS = {"raycluster-gang.yaml": 5, "raycluster-priority.yaml": 3,
                "raycluster-autoscaling.yaml": 3, "raycluster-multihost.yaml": 3,
                "rayjob-sidecar.yaml": 3, "rayservice.yaml": 3,
                "raycluster-gpu-fraction-capped.yaml": 3, "raycluster-gpu-autoscaler.yaml": 1}


@pytest.mark.usefixtures("kuberay_operator")
def test_every_ray_sample_is_valid_for_kuberay_and_has_the_gang_it_promises(
        cluster: Cluster, namespace: str) -> None:
    from kai_ray.grouping.ray import ray_gang

    files = sorted(p.name for p in (ROOT / "ray_samples").glob("ray*.yaml"))
    assert files == sorted(SAMPLE_GANGS)
    for name in files:
        path = ROOT / "ray_samples" / name
        # the API server checks the manifest against KubeRay's CRD schema
        cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
        doc = yaml.safe_load(path.read_text())
        spec = {"RayCluster": lambda d: d["spec"],
                "RayJob": lambda d: d["spec"]["rayClusterSpec"],
                "RayService": lambda d: d["spec"]["rayClusterConfig"]}[doc["kind"]](doc)
        assert ray_gang({"kind": "RayCluster", "metadata": doc["metadata"],
                         "spec": spec}).min_member == SAMPLE_GANGS[name], name
        assert doc["metadata"]["labels"].get("kai.scheduler/queue"), name
        if doc["kind"] == "RayJob":
            assert doc["spec"]["submissionMode"] != "K8sJobMode"  # KubeRay refuses it with KAI
