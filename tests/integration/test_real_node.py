"""A real kubelet node in the local plane: registration, pods, logs/exec, Services, cluster DNS,
the API server from a pod, fake GPUs through the device plugin, and a clean teardown.

Pods name the node directly (spec.nodeName): this tests the node, not a scheduler. HTTP clients
run in the debian-python image (GNU wget, getent): Debian's static busybox wget crashes with
SIGSEGV on this kind of machine, in a pod and on the host alike.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.testing import images, procs, realnode
from kai_ray.testing.nodes import KWOK_NODE_ANNOTATION
from kai_ray.testing.realnode import RealNode

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

UUID_RE = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    core = client.CoreV1Api(real_node.plane.api_client())
    name = f"rn-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    real_node.plane.wait_service_account(name)
    yield name
    # the pods gone (the kubelet confirms), not only deleted: their GPUs are free for the next
    core.delete_collection_namespaced_pod(name)
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(name).items and time.monotonic() < deadline:
        time.sleep(0.2)
    core.delete_namespace(name)


def _core(node: RealNode) -> client.CoreV1Api:
    return client.CoreV1Api(node.plane.api_client())


def _pod(node: RealNode, name: str, command: list[str], *, gpus: int = 0,
         labels: dict[str, str] | None = None, restart: str = "Never",
         image: str = "busybox") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": images.ensure(image).ref,
                            "imagePullPolicy": "Never", "command": command,
                            "resources": resources}],
        },
    }


def _wait_phase(core: client.CoreV1Api, ns: str, name: str, phases: set[str],
                timeout: float = 60) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, ns)
        if pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {ns}/{name} not in {phases} after {timeout:.0f}s: "
                                 f"{pod.status}")
        time.sleep(0.2)


def _exec(node: RealNode, ns: str, pod: str, *cmd: str) -> str:
    return node.plane.kubectl("exec", "-n", ns, pod, "--", *cmd, timeout=60).stdout


def test_node_registers_ready_with_device_plugin_gpus(real_node: RealNode) -> None:
    node = _core(real_node).read_node(real_node.name)
    conditions = {c.type: c.status for c in node.status.conditions}
    assert conditions["Ready"] == "True"
    # only the device plugin puts nvidia.com/gpu on a kubelet's node
    assert node.status.capacity["nvidia.com/gpu"] == "2"
    assert node.status.allocatable["nvidia.com/gpu"] == "2"
    assert node.status.node_info.kubelet_version == "v1.34.4"
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    assert {"type": "InternalIP", "address": realnode.GATEWAY} in [
        {"type": a.type, "address": a.address} for a in node.status.addresses]
    # what GPU feature discovery would say about the (fake) GPUs
    assert node.metadata.labels["nvidia.com/gpu.count"] == "2"
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    # KWOK must not manage it (nor play its pods)
    assert KWOK_NODE_ANNOTATION[0] not in (node.metadata.annotations or {})
    assert real_node.plane.timings["node_ready"] < 30
    # the kubelet refuses anonymous clients (its serving cert is the plane CA's)
    ctx = ssl.create_default_context(cafile=str(real_node.plane.pki.ca_cert))
    conn = http.client.HTTPSConnection(realnode.GATEWAY, realnode.KUBELET_PORT, context=ctx,
                                       timeout=5)
    conn.request("GET", "/pods")
    assert conn.getresponse().status == 401
    conn.close()
    # nothing a pod sends leaves this machine
    check = subprocess.run(["iptables", "-w", "-C", *realnode.FORWARD_RULE], check=False)
    assert check.returncode == 0
    # and what listens on the gateway address answers only this machine and its pods
    check = subprocess.run(["iptables", "-w", "-C", *realnode.GUARD_RULE], check=False)
    assert check.returncode == 0


def test_kwok_nodes_beside_it_still_play_their_pods(real_node: RealNode, ns: str) -> None:
    core = _core(real_node)
    [kwok] = real_node.plane.add_gpu_nodes(1, 4, prefix="kwok-beside-real-")
    pod = _pod(real_node, "on-kwok", ["sleep", "3600"], gpus=1)
    pod["spec"]["nodeName"] = kwok
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    core.create_namespaced_pod(ns, pod)
    running = _wait_phase(core, ns, "on-kwok", {"Running"})
    assert running.status.pod_ip.startswith("10.244.")  # KWOK's pod range, not the bridge's
    sandboxes = real_node.crictl("pods", "-q", "--namespace", ns)
    assert sandboxes.returncode == 0 and sandboxes.stdout.strip() == ""


def test_busybox_pod_runs_and_logs_and_exec_work(real_node: RealNode, ns: str) -> None:
    core = _core(real_node)
    core.create_namespaced_pod(ns, _pod(real_node, "hello", [
        "sh", "-c", "echo hello-from-a-real-container; sleep 3600"]))
    pod = _wait_phase(core, ns, "hello", {"Running"})
    assert pod.status.pod_ip and pod.status.pod_ip.startswith("10.77.0.")
    deadline = time.monotonic() + 20
    while "hello-from-a-real-container" not in (
            logs := real_node.plane.kubectl("logs", "-n", ns, "hello").stdout):
        assert time.monotonic() < deadline, f"no log line; got {logs!r}"
        time.sleep(0.2)
    assert _exec(real_node, ns, "hello", "cat", "/etc/hostname").strip() == "hello"
    # the limits are a real cgroup's
    assert _exec(real_node, ns, "hello", "sh", "-c", "echo $((6*7))").strip() == "42"


def test_service_by_dns_name_and_cluster_ip(real_node: RealNode, ns: str) -> None:
    core = _core(real_node)
    token = uuid.uuid4().hex
    core.create_namespaced_pod(ns, _pod(real_node, "web", [
        "sh", "-c", f"mkdir /www && echo {token} > /www/index.html && "
                    "exec httpd -f -p 8080 -h /www"], labels={"app": "web"}))
    core.create_namespaced_pod(ns, _pod(real_node, "client", ["sleep", "3600"],
                                        image="debian-python"))
    svc = core.create_namespaced_service(ns, {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"port": 80, "targetPort": 8080}]}})
    _wait_phase(core, ns, "web", {"Running"})
    _wait_phase(core, ns, "client", {"Running"})
    fqdn = f"web.{ns}.svc.cluster.local"
    lookup = _retry(lambda: _exec(real_node, ns, "client", "getent", "hosts", fqdn))
    assert lookup.split()[0] == svc.spec.cluster_ip
    by_name = _retry(lambda: _exec(real_node, ns, "client", "wget", "-qO-", "-T", "3",
                                   f"http://{fqdn}/"))
    assert by_name.strip() == token
    short = _exec(real_node, ns, "client", "wget", "-qO-", "-T", "3", "http://web/")
    assert short.strip() == token  # the pod's search path
    by_ip = _exec(real_node, ns, "client", "wget", "-qO-", "-T", "3",
                  f"http://{svc.spec.cluster_ip}/")
    assert by_ip.strip() == token


def test_pod_reaches_the_api_server_through_the_kubernetes_service(real_node: RealNode,
                                                                    ns: str) -> None:
    core = _core(real_node)
    endpoints = core.read_namespaced_endpoints("kubernetes", "default")
    assert [a.ip for s in endpoints.subsets for a in s.addresses] == [realnode.GATEWAY]
    core.create_namespaced_pod(ns, _pod(real_node, "api-client", ["sleep", "3600"],
                                        image="debian-python"))
    _wait_phase(core, ns, "api-client", {"Running"})
    script = ('wget -qO- -T 5 --no-check-certificate '
              '--header "Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/'
              'serviceaccount/token)" https://kubernetes.default.svc/version')
    out = _retry(lambda: _exec(real_node, ns, "api-client", "sh", "-c", script))
    assert '"gitVersion": "v1.34.4"' in out


def test_gpu_pod_gets_a_fake_gpu_uuid(real_node: RealNode, ns: str) -> None:
    core = _core(real_node)
    core.create_namespaced_pod(ns, _pod(real_node, "one-gpu", ["sleep", "3600"], gpus=1))
    _wait_phase(core, ns, "one-gpu", {"Running"})
    one = _exec(real_node, ns, "one-gpu", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES").strip()
    assert re.fullmatch(UUID_RE, one), one
    # the second GPU is the other one; a third does not exist
    core.create_namespaced_pod(ns, _pod(real_node, "other-gpu", ["sleep", "3600"], gpus=1))
    _wait_phase(core, ns, "other-gpu", {"Running"})
    other = _exec(real_node, ns, "other-gpu", "sh", "-c",
                  "echo $NVIDIA_VISIBLE_DEVICES").strip()
    assert re.fullmatch(UUID_RE, other) and other != one
    core.create_namespaced_pod(ns, _pod(real_node, "no-gpu-left", ["true"], gpus=1))
    rejected = _wait_phase(core, ns, "no-gpu-left", {"Failed", "Running", "Succeeded"})
    assert rejected.status.phase == "Failed", rejected.status
    assert "nvidia.com/gpu" in (rejected.status.reason or "") + (rejected.status.message or "")


def test_device_plugin_registers_again_when_the_kubelet_restarts(real_node: RealNode,
                                                                  ns: str) -> None:
    core = _core(real_node)
    log = real_node.plane.components["gpu-device-plugin"].log
    registered = log.read_text().count("registered 2 x nvidia.com/gpu")
    real_node.restart_kubelet()
    # the kubelet clears the plugin directory when it starts: only a new registration brings
    # the GPUs back (the node object keeps the old numbers meanwhile)
    deadline = time.monotonic() + 20
    while log.read_text().count("registered 2 x nvidia.com/gpu") <= registered:
        assert time.monotonic() < deadline, f"no new registration:\n{procs.tail(log)}"
        time.sleep(0.2)
    # Until its pod sources are synced, a restarted kubelet still counts the GPUs of pods
    # deleted before the restart (its checkpoint) and rejects a GPU pod: upstream behaviour,
    # gone within seconds. So a rejected pod is tried again, a few times.
    deadline = time.monotonic() + 60
    for attempt in range(100):
        name = f"after-restart-{attempt}"
        core.create_namespaced_pod(ns, _pod(real_node, name, ["sleep", "3600"], gpus=1))
        pod = _wait_phase(core, ns, name, {"Running", "Failed"})
        if pod.status.phase == "Running" or time.monotonic() > deadline:
            break
        assert pod.status.reason == "UnexpectedAdmissionError", pod.status
        time.sleep(1)
    assert pod.status.phase == "Running", pod.status
    env = _exec(real_node, ns, name, "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
    assert re.fullmatch(UUID_RE, env.strip()), env


@pytest.mark.realnode_teardown
def test_stop_leaves_nothing_behind(real_node: RealNode,
                                    real_node_host_before: dict[str, Any]) -> None:
    """Runs last (conftest): it stops the session's plane and node."""
    plane = real_node.plane
    core = _core(real_node)
    # something for each kind of leftover: a pod (mounts, veth, cgroup), a Service (chains)
    ns = "teardown"
    core.create_namespace({"metadata": {"name": ns}})
    plane.wait_service_account(ns)
    core.create_namespaced_pod(ns, _pod(real_node, "left", ["sleep", "3600"]))
    core.create_namespaced_service(ns, {"metadata": {"name": "left"}, "spec": {
        "selector": {"app": "x"}, "ports": [{"port": 80}]}})
    _wait_phase(core, ns, "left", {"Running"})
    pids = {n: c.pid for n, c in plane.components.items()}
    workdir = str(plane.workdir)

    plane.stop()

    assert [n for n, pid in pids.items() if procs.group_alive(pid)] == []
    assert realnode.mounts_under(workdir, *realnode.HOST_DIRS) == []
    assert realnode.kubepods_cgroups() == []
    after = realnode.host_snapshot()
    for tool, tables in after["iptables"].items():
        for table, chains in tables.items():
            had = real_node_host_before["iptables"].get(tool, {}).get(table, [])
            assert [c for c in chains if c.startswith("KUBE-") and c not in had] == [], (
                tool, table)
    new_links = set(after["links"]) - set(real_node_host_before["links"])
    assert realnode.BRIDGE not in after["links"]
    assert [link for link in new_links if link.startswith(("veth", realnode.BRIDGE))] == []
    assert after["absent_dirs"] == real_node_host_before["absent_dirs"]
    before_sysctls = real_node_host_before["sysctls"]
    changed = {k: (before_sysctls[k], v) for k, v in after["sysctls"].items()
               if k in before_sysctls and before_sysctls[k] != v}
    assert changed == {}


def _retry(call: Any, timeout: float = 30) -> str:
    """A few tries: Service rules and DNS records follow a new Service within a second or so."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(call())
        except (RuntimeError, ApiException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.realnode_teardown
def test_dev_cluster_up_real_node_status_down(tmp_path: Any) -> None:
    """`kai-ray dev-cluster up --real-node`: after the session's node is gone (one real node per
    machine), the CLI brings up a node with 3 fake GPUs; `down` leaves nothing."""
    state = tmp_path / "dev"
    env = {**os.environ, "KAI_RAY_DEV_CLUSTER_DIR": str(state)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kai_ray.cli", "dev-cluster", *args],
                              capture_output=True, text=True, env=env, timeout=240, check=False)

    up = cli("up", "--nodes", "1", "--real-node", "--real-node-gpus", "3")
    try:
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        assert "real node" in up.stdout
        status = cli("status")
        assert status.returncode == 0, status.stdout
        for name in ("containerd", "kubelet", "gpu-device-plugin", "kube-proxy", "coredns"):
            assert re.search(rf"{name}\s+pid \d+\s+running", status.stdout), status.stdout
        assert "3 fake nvidia.com/gpu" in status.stdout
        kubectl = [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig")]
        out = subprocess.run([*kubectl, "get", "node", socket.gethostname().lower(), "-o",
                              "jsonpath={.status.allocatable.nvidia\\.com/gpu}"],
                             capture_output=True, text=True, check=True)
        assert out.stdout == "3"
        _fractional_pod_with_default_settings(state, tmp_path)
    finally:
        down = cli("down")
    assert down.returncode == 0, f"{down.stdout}\n{down.stderr}"
    assert not state.exists()
    assert realnode.kubepods_cgroups() == []
    assert realnode.mounts_under(str(state), *realnode.HOST_DIRS) == []
    assert realnode.BRIDGE not in os.listdir("/sys/class/net")


def _fractional_pod_with_default_settings(state: Any, tmp_path: Any) -> None:
    """`kai-ray run` with no config on the dev cluster's real node: its default reservation
    image is there (dev-cluster up loads it), so a gpu-fraction pod runs with its device."""
    from kai_ray.testing.plane import ControlPlane
    from kai_ray.testing.scheduler_process import KaiRayProcess

    plane = ControlPlane.from_state(json.loads((state / "state.json").read_text()))
    core = client.CoreV1Api(plane.api_client())
    client.CustomObjectsApi(plane.api_client()).create_cluster_custom_object(
        "scheduling.run.ai", "v2", "queues", {
            "apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"},
            "spec": {"resources": {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                                   for r in ("cpu", "gpu", "memory")}}})
    proc = KaiRayProcess(state / "kubeconfig", tmp_path, extra_args=["--webhook"])
    proc.start()
    try:
        proc.wait_ready()
        pod = {"metadata": {"name": "frac", "labels": {"kai.scheduler/queue": "q"},
                            "annotations": {"gpu-fraction": "0.5"}},
               "spec": {"schedulerName": "kai-scheduler",
                        "nodeSelector": {"kai-ray.io/real-node": "true"},
                        "containers": [{"name": "main", "image": images.ensure("busybox").ref,
                                        "imagePullPolicy": "Never",
                                        "command": ["sleep", "3600"]}]}}
        core.create_namespaced_pod("default", pod)
        deadline = time.monotonic() + 90
        while core.read_namespaced_pod("frac", "default").status.phase != "Running":
            assert time.monotonic() < deadline, proc.log_tail(40)
            time.sleep(0.5)
        env = subprocess.run([str(state / "bin" / "kubectl"), "--kubeconfig",
                              str(state / "kubeconfig"), "exec", "frac", "--", "sh", "-c",
                              "echo $NVIDIA_VISIBLE_DEVICES $GPU_PORTION"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert re.fullmatch(rf"{UUID_RE} 0\.50\n", env), env
    finally:
        proc.stop()
