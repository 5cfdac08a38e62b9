"""Fractional GPUs where users run them: kai-ray (`kai-ray run --webhook`, out of cluster) places
pods on the real kubelet node, whose fake device plugin hands the reservation pod a GPU; kai-ray's
reservation image reports it on its own pod through the `kubernetes` Service with its own
ServiceAccount; the sharing pods' containers get that device and their portion. Then a
RayCluster of the Ray image with kai-ray's helper runs there for real."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kai_ray import api_names
from kai_ray.reservation import GPU_INDEX_ANNOTATION
from kai_ray.testing import images
from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.realnode import RealNode
from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.realnode, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
NS = "default"


@pytest.fixture(scope="module")
def sharing(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[KaiRayProcess]:
    """kai-ray as a user runs it against the real node's plane, with kai-ray's own reservation
    image (the name the chart would be given) and KAI's sample queues."""
    reservation = images.ensure("kai-ray-reservation")
    for name in ("busybox", "kai-ray-reservation"):
        real_node.import_image(images.ensure(name))
    work = tmp_path_factory.mktemp("kai-ray-real")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({"cyclePeriodSeconds": 1, "reservation": {
        "image": reservation.ref, "timeoutSeconds": 90}}))
    real_node.plane.kubectl("apply", "-f", str(ROOT / "ray_samples" / "kai-queues.yaml"))
    proc = KaiRayProcess(real_node.plane.kubeconfig, work,
                         extra_args=["--config", str(config), "--webhook"])
    proc.start()
    proc.wait_ready()
    yield proc
    proc.stop()


def _local_image(templates: list[dict[str, Any]], ref: str) -> None:
    """Pod templates given the locally built image: no registry is reachable here."""
    for template in templates:
        for c in template["spec"]["containers"]:
            c["image"], c["imagePullPolicy"] = ref, "Never"


def _env(node: RealNode, pod: str, *names: str) -> list[str]:
    script = "; ".join(f'echo "${n}"' for n in names)
    out = node.plane.kubectl("exec", "-n", NS, pod, "--", "sh", "-c", script, timeout=60)
    return out.stdout.splitlines()


def _running(core: client.CoreV1Api, selector: str, count: int) -> list[client.V1Pod]:
    pods = [p for p in core.list_namespaced_pod(NS, label_selector=selector).items
            if not p.metadata.deletion_timestamp]
    ok = len(pods) == count and all(p.status.phase == "Running" and all(
        c.ready for c in p.status.container_statuses or []) for p in pods)
    return pods if ok else []


def test_inference_deployments_share_a_device_on_the_real_node(
        real_node: RealNode, sharing: KaiRayProcess) -> None:
    core = client.CoreV1Api(real_node.plane.api_client())
    busybox = images.ensure("busybox").ref
    docs = list(yaml.safe_load_all(
        (ROOT / "ray_samples" / "inference-gpu-fraction.yaml").read_text()))
    t0 = time.monotonic()
    _local_image([d["spec"]["template"] for d in docs], busybox)
    real_node.plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(docs))
    pods = wait_for("the 0.7 and 0.2 Deployments' pods Running", lambda: _running(
        core, "app in (infer-large,infer-small)", 2), timeout=120,
        detail=lambda: sharing.log_tail(40))
    print(f"\nkubectl apply -> both fractional pods Running: {time.monotonic() - t0:.1f}s")
    by_app = {p.metadata.labels["app"]: p for p in pods}
    assert {p.spec.node_name for p in pods} == {real_node.name}
    large = _env(real_node, by_app["infer-large"].metadata.name,
                 "NVIDIA_VISIBLE_DEVICES", "GPU_PORTION")
    small = _env(real_node, by_app["infer-small"].metadata.name,
                 "NVIDIA_VISIBLE_DEVICES", "GPU_PORTION")
    assert large[0] == small[0] and large[0].startswith("GPU-"), (large, small)
    assert (large[1], small[1]) == ("0.70", "0.20")

    # the device is the one the device plugin gave the reservation pod, which its own program
    # reported (its log says so too)
    group = by_app["infer-large"].metadata.labels[api_names.GPU_GROUP_LABEL]
    (res,) = core.list_namespaced_pod(api_names.RESERVATION_NAMESPACE,
                                      label_selector=f"{api_names.GPU_GROUP_LABEL}={group}").items
    assert res.metadata.annotations[GPU_INDEX_ANNOTATION] == large[0]
    assert res.spec.node_name == real_node.name and res.status.phase == "Running"
    log = real_node.plane.kubectl("logs", "-n", api_names.RESERVATION_NAMESPACE,
                                  res.metadata.name).stdout
    assert f"holds GPU {large[0]}" in log, log

    # a third pod asking 0.5 does not fit the 0.1 left: it gets the other device
    third = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "half", "labels": {"kai.scheduler/queue": "team-a", "app": "half"},
        "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": busybox, "imagePullPolicy": "Never",
                                 "command": ["sleep", "3600"]}]}}
    core.create_namespaced_pod(NS, third)
    wait_for("the 0.5 pod Running", lambda: _running(core, "app=half", 1), timeout=90,
             detail=lambda: sharing.log_tail(40))
    other = _env(real_node, "half", "NVIDIA_VISIBLE_DEVICES", "GPU_PORTION")
    assert other[0].startswith("GPU-") and other[0] != large[0] and other[1] == "0.50", other

    # deleting the first two frees their device: its reservation pod goes away
    real_node.plane.kubectl("delete", "-n", NS, "deployment", "infer-large", "infer-small")
    wait_for("the shared device's reservation pod gone", lambda: not [
        p for p in core.list_namespaced_pod(api_names.RESERVATION_NAMESPACE).items
        if p.metadata.name == res.metadata.name], timeout=60,
        detail=lambda: sharing.log_tail(40))
    core.delete_namespaced_pod("half", NS, grace_period_seconds=0)
    wait_for("every reservation pod gone", lambda: not core.list_namespaced_pod(
        api_names.RESERVATION_NAMESPACE).items, timeout=60)


RAY_TASK = """
import json, os, ray
import kai_ray.ray as kr
ray.init()
@ray.remote(num_gpus=1)
def probe():
    return {"portion": os.environ.get("GPU_PORTION"),
            "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
            "node": ray.get_runtime_context().get_node_id(),
            "cap": kr.current_cap().as_dict()}
alive = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps({"alive": len(alive), "probes": ray.get([probe.remote() for _ in range(2)])}))
"""


def test_a_raycluster_with_half_gpu_workers_runs_for_real(
        real_node: RealNode, sharing: KaiRayProcess) -> None:
    core = client.CoreV1Api(real_node.plane.api_client())
    start_kuberay_operator(real_node.plane)
    ray_image = images.ensure("kai-ray-ray")
    real_node.import_image(ray_image)
    (cluster,) = yaml.safe_load_all(
        (ROOT / "ray_samples" / "raycluster-gpu-fraction-capped.yaml").read_text())
    spec = cluster["spec"]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        _local_image([group["template"]], ray_image.ref)
        for c in group["template"]["spec"]["containers"]:
            # 2 cores here: the sample's whole-core requests would not all fit beside the rest
            c["resources"] = {"requests": {"cpu": "100m", "memory": "512Mi"},
                              "limits": {"memory": "3Gi"}}
    spec["headGroupSpec"]["rayStartParams"] = {"num-cpus": "1"}
    t0 = time.monotonic()
    real_node.plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(cluster))
    name = cluster["metadata"]["name"]
    pods = wait_for("the RayCluster's head and two workers Running and ready", lambda: _running(
        core, f"ray.io/cluster={name}", 3), timeout=240, detail=lambda: sharing.log_tail(40))
    print(f"\nkubectl apply -> RayCluster pods ready: {time.monotonic() - t0:.1f}s")
    head = next(p for p in pods if p.metadata.labels["ray.io/node-type"] == "head")
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    visible = {_env(real_node, w.metadata.name, "NVIDIA_VISIBLE_DEVICES")[0] for w in workers}
    assert len(visible) == 1 and next(iter(visible)).startswith("GPU-"), visible

    out = real_node.plane.kubectl("exec", "-n", NS, head.metadata.name, "--", "python3", "-c",
                                  RAY_TASK, timeout=180).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["alive"] == 3, result  # the head sees both workers
    for probe in result["probes"]:
        assert probe["portion"] == "0.50" and probe["visible"] in visible, probe
        (device,) = probe["cap"]["devices"]
        # one Ray GPU of a half-GPU pod: the cap is the pod's portion
        assert device["share"] == pytest.approx(float(probe["portion"])), probe["cap"]
    real_node.plane.kubectl("delete", "-n", NS, "raycluster", name, "--wait=false")
