"""GPU reservation pods on a real API server: the reservation program reports its device on its
own pod with its own least-privilege ServiceAccount, reservation pods pass the "restricted" Pod
Security Standard, and a reservation pod that never reports neither stops the scheduling loop nor
leaves its waiting pods without a reason.

Runs on a control plane of its own: its scheduler has a short reservation timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.k8s import convert
from kai_ray.k8s.binder import RESERVATION_SERVICE_ACCOUNT, Binder
from kai_ray.k8s.events import EventRecorder
from kai_ray.reservation import GPU_INDEX_ANNOTATION
from kai_ray.testing.devices import SILENT_ANNOTATION
from kai_ray.testing.plane import ControlPlane
from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.helpers import create_queues, pod, queue, wait_for

pytestmark = pytest.mark.integration

NS = api_names.RESERVATION_NAMESPACE
TIMEOUT_S = 6  # the scheduler's reservation timeout here
FAKE_UUID = "GPU-5e1f0000-1111-2222-3333-444455556666"


@pytest.fixture(scope="module")
def nodes(plane: ControlPlane) -> dict[str, str]:
    """One KWOK GPU node whose reservation pods report, one whose never do."""
    good = plane.add_gpu_nodes(1, 2, prefix="good-", labels={"kai-ray.io/pool": "good"})[0]
    silent = plane.add_gpu_nodes(1, 2, prefix="silent-", labels={"kai-ray.io/pool": "silent"})[0]
    client.CoreV1Api(plane.api_client()).patch_node(silent, {"metadata": {"annotations": {
        SILENT_ANNOTATION[0]: SILENT_ANNOTATION[1]}}})
    return {"good": good, "silent": silent}


@pytest.fixture(scope="module")
def scheduler(plane: ControlPlane, nodes: dict[str, str],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[KaiRayProcess]:
    work = tmp_path_factory.mktemp("reservation-run")
    config = work / "config.yaml"
    config.write_text(f"cyclePeriodSeconds: 1\nreservation:\n  timeoutSeconds: {TIMEOUT_S}\n")
    create_queues(plane.api_client(), queue("res-root"), queue("res", "res-root"))
    proc = KaiRayProcess(plane.kubeconfig, work, extra_args=["--config", str(config)])
    proc.start()
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    name = f"res-{request.node.name[5:25].replace('_', '-').strip('-')}-{int(time.time()) % 10000}"
    client.CoreV1Api(plane.api_client()).create_namespace({"metadata": {"name": name}})
    plane.wait_service_account(name)
    return name


def _events(core: client.CoreV1Api, namespace: str, name: str, reason: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason={reason}").items]


def _sa_dir(plane: ControlPlane, tmp: Path, namespace: str, account: str) -> Path:
    """What the kubelet mounts into a pod of `account`: a bound token, the CA, the namespace."""
    core = client.CoreV1Api(plane.api_client())
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 600}}).status.token
    d = tmp / account
    d.mkdir()
    (d / "token").write_text(token)
    (d / "namespace").write_text(namespace)
    (d / "ca.crt").write_bytes((plane.workdir / "pki" / "ca.crt").read_bytes())
    return d


def _run_program(plane: ControlPlane, sa_dir: Path, pod_name: str, tmp: Path
                 ) -> tuple[subprocess.CompletedProcess[str], str]:
    log = tmp / f"termination-{pod_name}"
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(plane.ports["apiserver"]),
           "KAI_RAY_SA_DIR": str(sa_dir), "POD_NAME": pod_name, "POD_NAMESPACE": NS,
           "NVIDIA_VISIBLE_DEVICES": FAKE_UUID, "KAI_RAY_TERMINATION_LOG": str(log)}
    out = subprocess.run([sys.executable, "-m", "kai_ray.reservation", "--once"], env=env,
                         capture_output=True, text=True, timeout=60)
    return out, log.read_text() if log.exists() else ""


def test_the_program_reports_on_its_own_pod_with_its_own_account(plane: ControlPlane,
                                                                 tmp_path: Path) -> None:
    """The reservation ServiceAccount may annotate pods of its namespace; another account of
    that namespace may not, and the program then says so where the scheduler reads it."""
    api = plane.api_client()
    core = client.CoreV1Api(api)
    Binder(api, EventRecorder(api))._ensure_reservation_access()  # what the scheduler sets up
    plane.wait_service_account(NS)
    target = {"metadata": {"name": "held-by-program", "namespace": NS},
              # on no node: nothing else (the KWOK reporter) may report for it
              "spec": {"nodeName": "no-such-node",
                       "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                           "seccompProfile": {"type": "RuntimeDefault"}},
                       "containers": [{"name": "c", "image": "x", "securityContext": {
                           "allowPrivilegeEscalation": False,
                           "capabilities": {"drop": ["ALL"]}}}]}}
    # the namespace enforces the restricted standard: a pod without these is refused
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(NS, {"metadata": {"name": "plain", "namespace": NS},
                                        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert refused.value.status == 403 and "restricted" in refused.value.body
    core.create_namespaced_pod(NS, target)

    out, message = _run_program(plane, _sa_dir(plane, tmp_path, NS, "default"),
                                "held-by-program", tmp_path)
    assert out.returncode == 1, out.stderr
    assert "HTTP 403" in message and "held-by-program" in message, message
    ann = core.read_namespaced_pod("held-by-program", NS).metadata.annotations or {}
    assert GPU_INDEX_ANNOTATION not in ann

    holder = _sa_dir(plane, tmp_path, NS, RESERVATION_SERVICE_ACCOUNT)
    out, message = _run_program(plane, holder, "held-by-program", tmp_path)
    assert out.returncode == 0, (out.stderr, message)
    ann = core.read_namespaced_pod("held-by-program", NS).metadata.annotations or {}
    assert ann[GPU_INDEX_ANNOTATION] == FAKE_UUID

    # an answer retrying cannot change fails at once, named
    t0 = time.monotonic()
    out, message = _run_program(plane, holder, "no-such-pod", tmp_path)
    assert out.returncode == 1 and "HTTP 404" in message, message
    assert time.monotonic() - t0 < 10


def test_shared_pods_bind_on_one_device_through_a_restricted_reservation_pod(
        plane: ControlPlane, scheduler: KaiRayProcess, nodes: dict[str, str],
        namespace: str) -> None:
    core = client.CoreV1Api(plane.api_client())
    sel = {"kai-ray.io/pool": "good"}
    for name, fraction in (("infer-a", "0.7"), ("infer-b", "0.2")):
        core.create_namespaced_pod(namespace, pod(name, "res", node_selector=sel,
                                                  annotations={"gpu-fraction": fraction}))
    wait_for("both fractional pods Running", lambda: all(
        core.read_namespaced_pod(n, namespace).status.phase == "Running"
        for n in ("infer-a", "infer-b")), timeout=60, detail=scheduler.log_tail)
    groups = {n: core.read_namespaced_pod(n, namespace).metadata.labels.get(
        api_names.GPU_GROUP_LABEL) for n in ("infer-a", "infer-b")}
    assert groups["infer-a"] and groups["infer-a"] == groups["infer-b"], groups
    (res,) = core.list_namespaced_pod(
        NS, label_selector=f"{api_names.GPU_GROUP_LABEL}={groups['infer-a']}").items
    # the namespace enforces the restricted standard, so the API server checked this pod
    labels = core.read_namespace(NS).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert res.spec.service_account_name == RESERVATION_SERVICE_ACCOUNT
    assert res.spec.security_context.run_as_non_root is True
    assert res.metadata.annotations[GPU_INDEX_ANNOTATION].startswith(f"GPU-{nodes['good']}-")
    # both jobs' starts are stamped, also that of the one that waited for its reservation pod
    # (min-runtime protection counts from it)
    custom = client.CustomObjectsApi(plane.api_client())
    for n in ("infer-a", "infer-b"):
        group_name = core.read_namespaced_pod(n, namespace).metadata.annotations[
            "pod-group-name"]
        wait_for(f"{n}'s PodGroup stamped with its start", lambda g=group_name: convert.
                 LAST_START_ANNOTATION in (custom.get_namespaced_custom_object(
                     "scheduling.run.ai", "v2alpha2", namespace, "podgroups", g)[
                     "metadata"].get("annotations") or {}), timeout=10)
    # told on the pod that waited: the first decided (the pods may be decided in two cycles,
    # in either order; the second finds the device reported and binds at once)
    wait_for("a WaitingForGPUReservation event naming the reservation pod", lambda: any(
        res.metadata.name in m for n in ("infer-a", "infer-b")
        for m in _events(core, namespace, n, "WaitingForGPUReservation")), timeout=10)

    # the device is freed with its last sharer
    for n in ("infer-a", "infer-b"):
        core.delete_namespaced_pod(n, namespace, grace_period_seconds=0)
    wait_for("the reservation pod deleted", lambda: not [
        p for p in core.list_namespaced_pod(NS).items
        if p.metadata.name == res.metadata.name and not p.metadata.deletion_timestamp],
        timeout=30, detail=scheduler.log_tail)


def test_a_reservation_that_never_reports_does_not_stop_the_loop(
        plane: ControlPlane, scheduler: KaiRayProcess, nodes: dict[str, str],
        namespace: str) -> None:
    core = client.CoreV1Api(plane.api_client())
    core.create_namespaced_pod(namespace, pod("stuck", "res", annotations={"gpu-fraction": "0.5"},
                                              node_selector={"kai-ray.io/pool": "silent"}))
    # the scheduler decided it and waits for its reservation pod (created, never reporting)
    reservation = wait_for("the stuck pod's reservation pod", lambda: [
        p.metadata.name for p in core.list_namespaced_pod(NS).items
        if p.spec.node_name == nodes["silent"] and not p.metadata.deletion_timestamp],
        timeout=20, detail=scheduler.log_tail)[0]
    uid = core.read_namespaced_pod(reservation, NS).metadata.uid
    core.create_namespaced_pod(namespace, pod("other", "res", gpus=1,
                                              node_selector={"kai-ray.io/pool": "good"}))
    # from when its gang exists (the pod grouper runs beside the loop) to its bind
    wait_for("the other pod grouped", lambda: (core.read_namespaced_pod(
        "other", namespace).metadata.annotations or {}).get("pod-group-name"), timeout=10,
        interval=0.05)
    t0 = time.monotonic()
    wait_for("another pod bound meanwhile", lambda: core.read_namespaced_pod(
        "other", namespace).spec.node_name, timeout=10, interval=0.05,
        detail=scheduler.log_tail)
    assert time.monotonic() - t0 < 2.5, "bound, but not within two cycles of 1 s"
    assert core.read_namespaced_pod("stuck", namespace).spec.node_name is None
    waiting = wait_for("the stuck pod told what it waits for", lambda: _events(
        core, namespace, "stuck", "WaitingForGPUReservation"), timeout=10)
    assert reservation in waiting[0], waiting

    # past the deadline: rolled back, with the reservation pod named on the pod
    def failed_condition() -> object:
        for c in core.read_namespaced_pod("stuck", namespace).status.conditions or []:
            if c.type == "PodScheduled" and c.reason == "GPUReservationFailed":
                return c
        return None

    cond = wait_for("a GPUReservationFailed condition", failed_condition, timeout=TIMEOUT_S + 10,
                    detail=scheduler.log_tail)
    assert reservation in cond.message and "did not report" in cond.message, cond.message
    assert any(reservation in m for m in _events(core, namespace, "stuck",
                                                  "GPUReservationFailed"))
    # told when its state changed (created, Pending, Running; perhaps a retry's "created"),
    # not once a cycle through a wait of TIMEOUT_S cycles
    told = _events(core, namespace, "stuck", "WaitingForGPUReservation")
    assert len(told) <= 4 < TIMEOUT_S, told
    try:  # deleted (a later retry may make a new one: another uid)
        now = core.read_namespaced_pod(reservation, NS).metadata
        gone = now.uid != uid or now.deletion_timestamp is not None
    except ApiException as e:
        gone = e.status == 404
    assert gone, "the failed reservation pod was not deleted"
    assert core.read_namespaced_pod("stuck", namespace).spec.node_name is None
    assert scheduler.alive()
