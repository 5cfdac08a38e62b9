"""The admission webhook (kai_ray/controller/webhook.py) called by the real kube-apiserver."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.controller.webhook import (
    MUTATE_ID,
    VALIDATE_ID,
    WebhookConfig,
    WebhookHandle,
    remove_configurations,
    start_webhook,
)
from kai_ray.grouping import admission
from kai_ray.grouping.config import GroupingConfig
from kai_ray.testing.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE_API = ("scheduling.run.ai", "v2", "queues")
SUFFIX = uuid.uuid4().hex[:5]
PARENT, LEAF = f"wh-dept-{SUFFIX}", f"wh-team-{SUFFIX}"
EXEMPT_USER = "kai-ray-test-scheduler"  # stands for the scheduler's own identity (impersonated)


def _queue(name: str, parent: str | None = None) -> dict[str, Any]:
    res = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    spec: dict[str, Any] = {"resources": {"cpu": res, "gpu": res, "memory": res}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
            "spec": spec}


def _pod(name: str, *, annotations: dict[str, str] | None = None, queue: str | None = LEAF,
         scheduler: str = "kai-scheduler", limits: dict[str, str] | None = None,
         ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits:
        container["resources"] = {"limits": limits}
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    if queue:
        meta["labels"] = {"kai.scheduler/queue": queue}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": scheduler, "containers": [container]}}


def _wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _denial(core: client.CoreV1Api, namespace: str, pod: dict[str, Any]) -> str:
    """Create `pod`, expecting an admission denial; returns the API server's message."""
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(namespace, pod)
    assert info.value.status == 400, info.value.body
    return str(info.value.body)


@pytest.fixture(scope="module")
def queues(cluster: Cluster) -> Iterator[None]:
    custom = client.CustomObjectsApi(cluster.api_client())
    for q in (_queue(PARENT), _queue(LEAF, PARENT)):
        custom.create_cluster_custom_object(*QUEUE_API, q)
    yield
    for name in (LEAF, PARENT):
        custom.delete_cluster_custom_object(*QUEUE_API, name)


@pytest.fixture(scope="module")
def webhook(cluster: Cluster, queues: None) -> Iterator[WebhookHandle]:
    config = WebhookConfig(grouping=GroupingConfig(validate_queue=True),
                           configuration_name=f"kai-ray-test-{SUFFIX}",
                           exempt_updaters=(EXEMPT_USER,))
    handle = start_webhook(str(cluster.kubeconfig), config)
    try:
        handle.wait_ready(60)
        yield handle
    finally:
        handle.stop(remove_configuration=True)


@pytest.fixture
def core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client())


def test_fraction_out_of_range_is_rejected(webhook: WebhookHandle, core: client.CoreV1Api,
                                          namespace: str) -> None:
    msg = _denial(core, namespace, _pod("frac", annotations={"gpu-fraction": "1.5"}))
    assert "gpu-fraction annotation value must be a positive number smaller than 1.0" in msg
    assert "validate.pods." in msg  # the denial is ours, named by the webhook


def test_fraction_with_whole_gpu_limit_is_rejected(webhook: WebhookHandle,
                                                   core: client.CoreV1Api,
                                                   namespace: str) -> None:
    pod = _pod("both", annotations={"gpu-fraction": "0.5"}, limits={"nvidia.com/gpu": "1"})
    msg = _denial(core, namespace, pod)
    assert "cannot have both GPU fraction request and whole GPU resource request/limit" in msg


def test_invalid_gpu_memory_is_rejected(webhook: WebhookHandle, core: client.CoreV1Api,
                                        namespace: str) -> None:
    msg = _denial(core, namespace, _pod("mem", annotations={"gpu-memory": "2GiB"}))
    assert "gpu-memory annotation value must be a positive integer greater than 0" in msg


def test_unknown_and_non_leaf_queues_are_rejected(webhook: WebhookHandle, cluster: Cluster,
                                                  core: client.CoreV1Api,
                                                  namespace: str) -> None:
    missing = f"wh-missing-{SUFFIX}"
    msg = _denial(core, namespace, _pod("unknown", queue=missing))
    assert f"pod {namespace}/unknown: queue '{missing}' does not exist" in msg
    msg = _denial(core, namespace, _pod("parent", queue=PARENT))
    assert f"queue '{PARENT}' is not a leaf queue (child queues: {LEAF})" in msg

    # a queue created an instant ago is found even before the watch delivers it
    custom = client.CustomObjectsApi(cluster.api_client())
    custom.create_cluster_custom_object(*QUEUE_API, _queue(missing, PARENT))
    try:
        core.create_namespaced_pod(namespace, _pod("unknown", queue=missing))
    finally:
        custom.delete_cluster_custom_object(*QUEUE_API, missing)


def test_namespace_queue_label_is_checked(webhook: WebhookHandle, core: client.CoreV1Api,
                                          namespace: str) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {"kai.scheduler/queue": "wh-nope"}}})

    def denied_for_namespace_queue() -> bool:
        try:
            core.create_namespaced_pod(namespace, _pod("nsq", queue=None))
        except ApiException as e:
            return "queue 'wh-nope' does not exist" in str(e.body)
        core.delete_namespaced_pod("nsq", namespace)
        return False
    _wait_for("the namespace's queue label to be checked", denied_for_namespace_queue)

    core.patch_namespace(namespace, {"metadata": {"labels": {"kai.scheduler/queue": LEAF}}})

    def admitted() -> bool:
        try:
            core.create_namespaced_pod(namespace, _pod("nsq", queue=None))
        except ApiException as e:
            assert "wh-nope" in str(e.body), e.body
            return False
        return True
    _wait_for(f"a pod of a namespace labelled {LEAF} to be admitted", admitted)


def _env(pod: client.V1Pod) -> dict[str, Any]:
    return {e.name: e for e in pod.spec.containers[0].env or []}


def test_fractional_pod_is_admitted_and_wired_to_its_configmap(webhook: WebhookHandle,
                                                               core: client.CoreV1Api,
                                                               namespace: str) -> None:
    pod = _pod("half", annotations={"gpu-fraction": "0.5"})
    pod["spec"]["containers"][0]["env"] = [{"name": "KEEP", "value": "me"}]
    created = core.create_namespaced_pod(namespace, pod)
    prefix = created.metadata.annotations[admission.CONFIGMAP_ANNOTATION]
    assert prefix.startswith("half-") and prefix.endswith("-shared-gpu")
    env = _env(created)
    assert env["KEEP"].value == "me"
    for name in (admission.NVIDIA_VISIBLE_DEVICES, admission.GPU_PORTION,
                 admission.RUNAI_NUM_OF_GPUS):
        ref = env[name].value_from.config_map_key_ref
        assert (ref.name, ref.key) == (f"{prefix}-0", name)
    assert admission.GPU_MEMORY_LIMIT not in env

    created = core.create_namespaced_pod(namespace, _pod("mem", annotations={"gpu-memory": "2000"}))
    ref = _env(created)[admission.GPU_MEMORY_LIMIT].value_from.config_map_key_ref
    assert ref.name == created.metadata.annotations[admission.CONFIGMAP_ANNOTATION] + "-0"


def _annotate(cluster: Cluster, namespace: str, pod: str, *pairs: str,
              as_user: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl annotate --overwrite`` as the test's admin, or impersonating ``as_user``."""
    cmd = [cluster.kubectl_path(), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace,
           "annotate", "--overwrite", f"pod/{pod}", *pairs]
    if as_user:
        cmd += [f"--as={as_user}", "--as-group=system:masters"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_updates_cannot_forge_scheduler_annotations_or_break_a_fraction(
        webhook: WebhookHandle, cluster: Cluster, core: client.CoreV1Api,
        namespace: str) -> None:
    # kept Pending (no node matches): a bound pod's fraction may no longer change at all
    edited = _pod("edited", annotations={"gpu-fraction": "0.5"})
    edited["spec"]["nodeSelector"] = {"kai-ray.io/no-such-pool": "none"}
    core.create_namespaced_pod(namespace, edited)

    out = _annotate(cluster, namespace, "edited", "gpu-fraction=1.5")
    assert out.returncode != 0
    assert "gpu-fraction annotation value must be a positive number smaller than 1.0" in \
        out.stderr, out.stderr
    assert "validate.pods." in out.stderr  # refused by us, through the API server

    out = _annotate(cluster, namespace, "edited", 'kai-ray.io/bind-intent={"edited":{}}')
    assert out.returncode != 0
    assert ("annotation kai-ray.io/bind-intent is written only by the scheduler: pod "
            f"{namespace}/edited may not set it") in out.stderr, out.stderr

    # updates that leave both alone pass, as does a valid new fraction
    assert _annotate(cluster, namespace, "edited", "note=hello").returncode == 0
    assert _annotate(cluster, namespace, "edited", "gpu-fraction=0.25").returncode == 0
    ann = core.read_namespaced_pod("edited", namespace).metadata.annotations
    assert (ann["gpu-fraction"], ann["note"]) == ("0.25", "hello")
    assert "kai-ray.io/bind-intent" not in ann

    # the scheduler's own identity (exempt_updaters) never reaches the webhook on UPDATE
    before = webhook.calls[VALIDATE_ID]
    out = _annotate(cluster, namespace, "edited", "exempt=yes", as_user=EXEMPT_USER)
    assert out.returncode == 0, out.stderr
    assert webhook.calls[VALIDATE_ID] == before


def test_other_pods_never_reach_the_webhook(webhook: WebhookHandle, core: client.CoreV1Api,
                                            namespace: str) -> None:
    before = dict(webhook.calls)
    # invalid for kai-scheduler, but this pod belongs to the default scheduler
    pod = _pod("other", annotations={"gpu-fraction": "1.5"}, queue="no-such-queue",
               scheduler="default-scheduler")
    created = core.create_namespaced_pod(namespace, pod)
    assert admission.CONFIGMAP_ANNOTATION not in (created.metadata.annotations or {})
    assert not created.spec.containers[0].env
    assert dict(webhook.calls) == before  # the match condition kept the API server away

    core.create_namespaced_pod(namespace, _pod("ours"))
    assert webhook.calls[VALIDATE_ID] == before.get(VALIDATE_ID, 0) + 1
    assert webhook.calls[MUTATE_ID] == before.get(MUTATE_ID, 0) + 1


def test_stopped_webhook_blocks_only_our_pods(cluster: Cluster, queues: None,
                                              core: client.CoreV1Api, namespace: str) -> None:
    name = f"kai-ray-gone-{SUFFIX}"
    handle = start_webhook(str(cluster.kubeconfig), WebhookConfig(configuration_name=name))
    try:
        handle.wait_ready(60)
        core.create_namespaced_pod(namespace, _pod("ours-before"))
        handle.stop(remove_configuration=False)  # the configurations now point at nothing
        adm = client.AdmissionregistrationV1Api(cluster.api_client())
        assert adm.read_validating_webhook_configuration(name).webhooks[0].failure_policy == "Fail"

        t0 = time.monotonic()
        core.create_namespaced_pod(namespace, _pod("plain", scheduler="default-scheduler"))
        assert time.monotonic() - t0 < 2.0  # not even a connection attempt delays it

        with pytest.raises(ApiException) as info:  # fail closed for our scheduler's pods
            core.create_namespaced_pod(namespace, _pod("ours"))
        assert "failed calling webhook" in str(info.value.body), info.value.body

        # an UPDATE reaches the webhook only when it changes annotations: a label edit (or
        # the garbage collector's ownerReference change) passes while it is down
        core.patch_namespaced_pod("ours-before", namespace,
                                  {"metadata": {"labels": {"edited": "yes"}}})
        with pytest.raises(ApiException) as info:
            core.patch_namespaced_pod("ours-before", namespace,
                                      {"metadata": {"annotations": {"note": "x"}}})
        assert "failed calling webhook" in str(info.value.body), info.value.body
    finally:
        handle.stop()
        remove_configurations(cluster.api_client(), name)


def test_a_configuration_the_api_server_refuses_fails_wait_ready(cluster: Cluster) -> None:
    handle = start_webhook(str(cluster.kubeconfig),
                           WebhookConfig(configuration_name="Not_A_DNS_Name"))
    try:
        t0 = time.monotonic()
        refused = r"configuration .Not_A_DNS_Name.: HTTP 422: .* is invalid"
        with pytest.raises(RuntimeError, match=refused):
            handle.wait_ready(30)
        assert time.monotonic() - t0 < 10  # the error, not the timeout
    finally:
        handle.stop()
