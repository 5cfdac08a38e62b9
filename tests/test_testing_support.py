"""Unit tests of the control-plane support code that need no binaries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from cryptography import x509

import kai_ray
from kai_ray.k8s.crds import crd_manifests, crd_names
from kai_ray.testing import procs
from kai_ray.testing.nodes import gpu_node_manifest, node_ip
from kai_ray.testing.pki import write_kubeconfig, write_pki


def test_crds_are_kai_groups_versions_and_scopes() -> None:
    assert crd_names() == ["queues.scheduling.run.ai", "podgroups.scheduling.run.ai",
                           "bindrequests.scheduling.run.ai"]
    shape = {m["spec"]["names"]["kind"]: (m["spec"]["scope"], m["spec"]["versions"][0]["name"])
             for m in crd_manifests()}
    assert shape == {"Queue": ("Cluster", "v2"), "PodGroup": ("Namespaced", "v2alpha2"),
                     "BindRequest": ("Namespaced", "v1alpha2")}
    for m in crd_manifests():
        assert m["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_queue_schema_validates_numbers_and_podgroup_minmember() -> None:
    queue, podgroup, _ = crd_manifests()
    spec = queue["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    gpu = spec["properties"]["resources"]["properties"]["gpu"]["properties"]
    assert gpu["quota"] == {"type": "number", "minimum": -1,
                            "description": "Guaranteed amount; -1 = unlimited."}
    assert spec["required"] == ["resources"]
    pg = podgroup["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert pg["properties"]["minMember"]["minimum"] == 1
    assert podgroup["spec"]["names"]["shortNames"] == ["pg"]
    columns = [c["name"] for c in queue["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Priority", "Parent", "Children", "DisplayName"]


def test_gpu_node_manifest_has_capacity_and_feature_discovery_labels() -> None:
    node = gpu_node_manifest("n-3", 3, 8)
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert {"type": "InternalIP", "address": node_ip(3)} in node["status"]["addresses"]
    assert len({node_ip(i) for i in range(1000)}) == 1000


def test_pki_and_kubeconfig(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    admin = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    orgs = admin.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    serving = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes())
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    cfg = yaml.safe_load(write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", pki).read_text())
    assert cfg["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"
    assert (pki.sa_key.stat().st_mode & 0o777) == 0o600


def test_stop_group_kills_the_child_and_what_it_forked(tmp_path: Path) -> None:
    # a shell that ignores SIGTERM and forks a sleeper: both must be gone afterwards
    script = "trap '' TERM; sleep 300 & wait"
    proc = procs.spawn(["bash", "-c", script], tmp_path / "log", detached=False)
    time.sleep(0.3)
    assert procs.group_alive(proc.pid)
    t0 = time.monotonic()
    procs.stop_group(proc.pid, proc=proc, grace=0.5)
    assert not procs.group_alive(proc.pid)
    assert time.monotonic() - t0 < 5


def test_attached_child_dies_with_its_parent(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from kai_ray.testing import procs; "
            f"p = procs.spawn(['sleep', '300'], Path({str(tmp_path / 'log')!r}), detached=False); "
            "print(p.pid, flush=True); time.sleep(300)")
    env = {**os.environ, "PYTHONPATH": str(Path(kai_ray.__file__).resolve().parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert procs.group_alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while procs.group_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.group_alive(child)


def test_free_ports_are_distinct_and_unused() -> None:
    ports = procs.free_ports(5)
    assert len(set(ports)) == 5
    assert not any(procs.port_listening(p) for p in ports)


class _ReservationPods:
    """The two CoreV1Api calls the KWOK GPU reporter makes, over a list of reservation pods."""

    def __init__(self, pods: list[dict[str, object]]) -> None:
        from kubernetes import client
        self.pods = pods
        self.client = client
        self.patches: list[tuple[str, object]] = []

    def list_namespaced_pod(self, namespace: str) -> object:
        items = [self.client.V1Pod(
            metadata=self.client.V1ObjectMeta(name=p["name"], annotations=p.get("ann")),
            spec=self.client.V1PodSpec(node_name=p["node"], containers=[]))
            for p in self.pods]
        return self.client.V1PodList(items=items)

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, object]) -> None:
        self.patches.append((name, body))


def test_kwok_gpu_reporter_reports_each_pod_once_whatever_stale_event_arrives() -> None:
    """A status event that predates the reporter's own patch must not report the pod again:
    the second report would give it another device after the binder handed out the first."""
    from kai_ray.testing.devices import GPU_INDEX_ANNOTATION, KwokGpuReporter

    reporter = KwokGpuReporter.__new__(KwokGpuReporter)
    reporter._kwok_nodes = {"n1": True}
    core = _ReservationPods([
        {"name": "a", "node": "n1", "ann": {GPU_INDEX_ANNOTATION: "GPU-n1-0"}},
        {"name": "b", "node": "n1", "ann": {GPU_INDEX_ANNOTATION: "GPU-n1-1"}},
        {"name": "c", "node": "n1"}])
    reporter.core = core  # type: ignore[assignment]
    reporter.reported = 0
    stale_b = {"metadata": {"name": "b"}, "spec": {"nodeName": "n1"}}
    reporter._report(stale_b)
    assert core.patches == []
    reporter._report({"metadata": {"name": "c"}, "spec": {"nodeName": "n1"}})
    assert core.patches == [("c", {"metadata": {"annotations": {GPU_INDEX_ANNOTATION:
                                                                "GPU-n1-2"}}})]
