"""The peer schedulers' harness (kai_ray/testing/peers.py): the objects each peer's users and
admins create, and, where tools/peers/build.sh has built a peer, that it really binds a gang and
bare pods on a local plane. CI does not build the peers (tens of minutes), so those tests skip
unless `tools/peers/build.sh --check PEER` passes."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kai_ray.testing import binaries, peers

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tools" / "peers" / "build.sh"


def _meta(pod: dict) -> tuple[dict, dict]:
    m = pod["metadata"]
    return m.get("labels") or {}, m.get("annotations") or {}


def test_every_scheduler_is_known() -> None:
    assert set(peers.PEERS) == {"kai", "kube", "kai-scheduler", "volcano", "coscheduling",
                                "yunikorn"}
    with pytest.raises(ValueError, match="unknown scheduler"):
        peers.make("slurm")


def test_every_pod_asks_the_same_and_names_its_scheduler() -> None:
    for key, cls in peers.PEERS.items():
        peer = peers.make(key)
        for pod in (peer.pod("p", "g", 8, gpus=2), peer.pod("q", None, 1)):
            spec = pod["spec"]
            assert spec["schedulerName"] == cls.scheduler_name, key
            res = spec["containers"][0]["resources"]
            assert res["requests"] == {"cpu": "100m", "memory": "128Mi"}, key
        assert peer.pod("p", "g", 8, gpus=2)["spec"]["containers"][0]["resources"][
            "limits"] == {"nvidia.com/gpu": "2"}


def test_kai_scheduler_gang_is_a_v2alpha2_podgroup_named_by_its_pods() -> None:
    peer = peers.make("kai-scheduler")
    group, pods = peer.gang("rc-1", 8)
    assert group == {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                     "metadata": {"name": "rc-1"}, "spec": {"queue": "bench", "minMember": 8}}
    assert len(pods) == 8
    labels, ann = _meta(pods[0])
    assert labels == {"kai.scheduler/queue": "bench"}
    assert ann == {"pod-group-name": "rc-1"}
    # a bare pod carries only the queue label: KAI's pod grouper gives it its PodGroup
    assert _meta(peer.pod("b", None, 1)) == ({"kai.scheduler/queue": "bench"}, {})
    assert peer.pod("b", None, 1)["spec"]["schedulerName"] == "kai-scheduler"


def test_volcano_gang_and_bare_pod() -> None:
    peer = peers.make("volcano")
    group, pods = peer.gang("rc-1", 4)
    assert group is not None
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"queue": "bench", "minMember": 4}
    assert _meta(pods[3])[1] == {"scheduling.k8s.io/group-name": "rc-1"}
    assert _meta(peer.pod("b", None, 1))[1] == {"scheduling.volcano.sh/queue-name": "bench"}


def test_coscheduling_gang_and_profile() -> None:
    peer = peers.Coscheduling()
    group, pods = peer.gang("rc-1", 8)
    assert group is not None
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 8}
    assert _meta(pods[0])[0] == {"scheduling.x-k8s.io/pod-group": "rc-1"}
    assert _meta(peer.pod("b", None, 1)) == ({}, {})
    cfg = peer.config(Path("/k/config"), 100, 200)
    # with --config, kube-scheduler takes its rate limit from clientConnection only
    assert cfg["clientConnection"] == {"kubeconfig": "/k/config", "qps": 100, "burst": 200}
    assert cfg["leaderElection"] == {"leaderElect": False}
    (profile,) = cfg["profiles"]
    assert profile["schedulerName"] == peer.scheduler_name
    assert profile["plugins"]["multiPoint"]["enabled"] == [{"name": "Coscheduling"}]
    assert profile["plugins"]["queueSort"]["enabled"] == [{"name": "Coscheduling"}]
    yaml.safe_dump(cfg)  # what start() writes


def test_yunikorn_gang_is_a_task_group() -> None:
    peer = peers.YuniKorn()
    group, pods = peer.gang("rc-1", 8, gpus=1)
    assert group is None  # no group object: the pods' annotations define the gang
    labels, ann = _meta(pods[0])
    assert labels == {"yunikorn.apache.org/queue": "root.bench",
                      "yunikorn.apache.org/app-id": "rc-1"}
    assert ann["yunikorn.apache.org/task-group-name"] == "workers"
    (tg,) = json.loads(ann["yunikorn.apache.org/task-groups"])
    assert tg == {"name": "workers", "minMember": 8,
                  "minResource": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}}
    assert _meta(peer.pod("b", None, 1)) == ({"yunikorn.apache.org/queue": "root.bench"}, {})
    placeholder = {"metadata": {"annotations": {"internal.yunikorn.apache.org/placeholder":
                                                "true"}}}
    assert not peer.is_own_pod(placeholder)
    assert peer.is_own_pod(pods[0])
    cm = peer.configmap(100, 200)
    assert cm["data"]["kubernetes.qps"] == "100" and cm["data"]["kubernetes.burst"] == "200"
    queues = yaml.safe_load(cm["data"]["queues.yaml"])
    (root,) = queues["partitions"][0]["queues"]
    assert [q["name"] for q in root["queues"]] == ["bench"]


def test_kube_scheduler_has_no_gangs() -> None:
    peer = peers.make("kube")
    assert not peer.gangs
    assert peer.group("g", 8) is None


def _bind_throughput():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "bind_throughput", ROOT / "benchmarks" / "bind_throughput.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_workload_is_the_same_pods_for_every_scheduler() -> None:
    bt = _bind_throughput()
    for key in peers.PEERS:
        peer = peers.make(key)
        groups, pods = bt.workload(peer, 5, 3, 4, 0)
        assert len(pods) == 5 + 3 * 4, key
        assert len({p["metadata"]["name"] for p in pods}) == len(pods)
        assert groups == ([] if not peer.gangs else [(f"gang-{g}", 4) for g in range(3)]), key


def test_api_requests_per_bound_pod() -> None:
    bt = _bind_throughput()
    diff = {("POST", "pods", "binding"): 10, ("POST", "events", ""): 10,
            ("PATCH", "pods", "status"): 10, ("PUT", "leases", ""): 40,
            ("PATCH", "nodes", "status"): 5, ("WATCH", "pods", ""): 1}
    assert bt.writes_per_pod(diff, 10) == {"writes_per_pod": 7.5,
                                           "writes_per_pod_without_heartbeats": 3.0}
    per = bt.requests_per_pod(diff, 10)
    assert next(iter(per)) == "PUT leases" and per["POST pods/binding"] == 1.0
    assert per["WATCH pods"] == 0.1
    assert bt.writes_per_pod(diff, 0)["writes_per_pod"] is None


def test_build_script_arguments() -> None:
    out = subprocess.run([str(BUILD), "--check", "slurm"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and "unknown peer" in out.stderr
    if shutil.which("go") is None:
        pytest.skip("no Go: build.sh cannot compute its cache key")
    out = subprocess.run([str(BUILD), "--print-dir"], capture_output=True, text=True,
                         timeout=60, check=True)
    assert "/peers-" in out.stdout.strip()


# -- the real thing, where built -------------------------------------------------------------
BUILT = ["kai-scheduler", "volcano", "coscheduling", "yunikorn"]


@pytest.mark.integration
@pytest.mark.parametrize("key", BUILT)
def test_peer_binds_a_gang_and_bare_pods(key: str, tmp_path: Path) -> None:
    ok, why = peers.peers_built(key)
    if not ok:
        pytest.skip(f"`tools/peers/build.sh --check {key}` fails (CI does not build the peers: "
                    f"too slow): {why}")
    try:
        binaries.require(*binaries.CONTROL_PLANE)
    except binaries.BinariesMissing as e:
        pytest.skip(f"control-plane binaries not built: {e}")
    from kai_ray.testing.plane import ControlPlane

    plane = ControlPlane()
    plane.start()
    peer = peers.make(key)
    try:
        plane.add_gpu_nodes(3, 8)
        api = plane.api_client()
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "peer"}})
        plane.wait_service_account("peer")
        peer.install(plane, "peer")
        peer.create_group(api, "peer", "rc", 3)
        group_pods = peer.gang("rc", 3)[1]
        pods = [*group_pods, peer.pod("bare-0", None, 1), peer.pod("bare-1", None, 1)]
        for p in pods:
            core.create_namespaced_pod("peer", p)
        peer.start(plane, 100, 200)
        names = {p["metadata"]["name"] for p in pods}
        deadline = time.monotonic() + 50
        bound: set[str] = set()
        while time.monotonic() < deadline and bound != names:
            bound = {p.metadata.name for p in core.list_namespaced_pod("peer").items
                     if p.spec.node_name and p.metadata.name in names}
            for name, comp in plane.components.items():
                assert comp.alive(), f"{name} exited:\n{comp.log.read_text()[-3000:]}"
            time.sleep(0.5)
        logs = "\n".join(f"--- {n}\n{p.read_text()[-2000:]}" for n, p in peer.logs(plane).items())
        assert bound == names, f"bound {sorted(bound)} of {sorted(names)}\n{logs}"
    finally:
        peer.stop(plane)
        plane.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
