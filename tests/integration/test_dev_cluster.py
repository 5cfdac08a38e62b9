"""`kai-ray dev-cluster`: 4 KWOK GPU nodes, the real KubeRay operator, and a clean `down`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kai_ray
from kai_ray.testing import binaries, procs

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(300)]


def dev_cluster(state: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # run the same kai_ray the tests import, whichever checkout that is
    root = str(Path(kai_ray.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "KAI_RAY_DEV_CLUSTER_DIR": str(state), "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "kai_ray.cli", "dev-cluster", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)


@pytest.fixture
def dev_state(tmp_path: Path) -> Iterator[Path]:
    """A private state dir; `down` runs at the end even when the test failed."""
    try:
        binaries.require(*binaries.ALL_BINARIES)
    except binaries.BinariesMissing as e:
        pytest.fail(f"run tools/cluster/build.sh first: {e}")
    state = tmp_path / "dev-cluster"
    yield state
    if (state / "state.json").exists():
        dev_cluster(state, "down")


def kubectl(state: Path, *args: str, as_json: bool = True) -> Any:
    """The dev cluster's own kubectl (state/bin) with its kubeconfig."""
    env = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}
    out = subprocess.run([str(state / "bin" / "kubectl"), *args, *(["-o", "json"] * as_json)],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return json.loads(out.stdout) if as_json else out.stdout


def test_dev_cluster_with_kuberay_creates_kai_scheduler_pods_and_down_leaves_nothing(
        dev_state: Path) -> None:
    up = dev_cluster(dev_state, "up", "--nodes", "4", "--gpus-per-node", "8", "--kuberay")
    assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
    assert f"export KUBECONFIG={dev_state / 'kubeconfig'}" in up.stdout

    env = dev_cluster(dev_state, "env")
    assert env.returncode == 0 and f"{dev_state / 'bin'}:$PATH" in env.stdout, env
    assert (dev_state / "bin" / "helm").exists() and (dev_state / "bin" / "kubectl").exists()
    status = dev_cluster(dev_state, "status")
    assert status.returncode == 0 and "ray-operator" in status.stdout, status.stdout

    nodes = kubectl(dev_state, "get", "nodes")["items"]
    assert len(nodes) == 4
    assert all(n["status"]["capacity"]["nvidia.com/gpu"] == "8" for n in nodes)

    # KubeRay's own sample, unchanged: two Queues and RayCluster raycluster-sample (queue team-a)
    sample = binaries.kuberay_sample("ray-cluster.kai-scheduler.yaml")
    kubectl(dev_state, "create", "-n", "default", "-f", str(sample), as_json=False)

    deadline = time.monotonic() + 60
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = kubectl(dev_state, "get", "pods", "-n", "default",
                       "-l", "ray.io/cluster=raycluster-sample")["items"]
        if len(pods) == 3:
            break
        time.sleep(0.5)
    assert len(pods) == 3, f"expected head + 2 workers from KubeRay, got {len(pods)}"
    kinds = sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in pods)
    assert kinds == ["head", "worker", "worker"]
    for p in pods:
        assert p["spec"]["schedulerName"] == "kai-scheduler"
        assert p["metadata"]["labels"]["kai.scheduler/queue"] == "team-a"
        assert p["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
        # no kai-ray scheduler runs in this test, so KubeRay's pods wait unbound
        assert "nodeName" not in p["spec"] and p["status"]["phase"] == "Pending"

    state = json.loads((dev_state / "state.json").read_text())
    down = dev_cluster(dev_state, "down")
    assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
    for name, comp in state["components"].items():
        assert not procs.group_alive(comp["pid"]), f"{name} (pid {comp['pid']}) still running"
    for name, port in state["ports"].items():
        assert not procs.port_listening(port), f"port {port} ({name}) still listening"
    assert not dev_state.exists()


def _pods(state: Path, selector: str) -> list[dict[str, Any]]:
    return kubectl(state, "get", "pods", "-n", "default", "-l", selector)["items"]


def _wait_running(state: Path, selector: str, count: int, proc: Any, timeout: float = 90
                  ) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = _pods(state, selector)
        if len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods):
            return pods
        time.sleep(0.5)
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
    raise AssertionError(f"{selector}: expected {count} Running, got {phases}\n"
                         f"{proc.log_tail(60)}")


def _configmap_env(state: Path, pod: dict[str, Any]) -> dict[str, str]:
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    cms = [c for c in kubectl(state, "get", "configmaps", "-n", "default")["items"]
           if c["metadata"]["name"].startswith(prefix)]
    assert len(cms) == 1, [c["metadata"]["name"] for c in cms]
    return dict(cms[0]["data"])


def test_fractional_pods_run_on_the_kwok_dev_cluster_as_a_user_runs_it(
        dev_state: Path, tmp_path: Path) -> None:
    """`dev-cluster up`, `kai-ray run`, `kubectl apply`: the 0.7 and 0.2 inference Deployments
    share one device; KubeRay's GPU-sharing sample, unchanged, runs with its two half-GPU
    workers on one device. Nothing but the dev cluster's KWOK GPU reporter stands in for the
    reservation pods' program (KWOK runs no containers)."""
    from kai_ray.testing.scheduler_process import KaiRayProcess

    up = dev_cluster(dev_state, "up", "--nodes", "2", "--gpus-per-node", "2", "--kuberay")
    assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
    assert "kwok-gpu-reporter" in dev_cluster(dev_state, "status").stdout
    proc = KaiRayProcess(dev_state / "kubeconfig", tmp_path)
    proc.start()
    try:
        proc.wait_ready()
        sample = binaries.kuberay_sample("ray-cluster.kai-gpu-sharing.yaml")
        kubectl(dev_state, "create", "-n", "default", "-f", str(sample), as_json=False)
        root = Path(kai_ray.__file__).resolve().parents[1]
        kubectl(dev_state, "apply", "-n", "default", "-f",
                str(root / "ray_samples" / "inference-gpu-fraction.yaml"), as_json=False)

        infer = _wait_running(dev_state, "app in (infer-large,infer-small)", 2, proc)
        by_app = {p["metadata"]["labels"]["app"]: p for p in infer}
        groups = {a: p["metadata"]["labels"].get("runai-gpu-group") for a, p in by_app.items()}
        assert groups["infer-large"] and groups["infer-large"] == groups["infer-small"], groups
        large, small = (_configmap_env(dev_state, by_app[a]) for a in ("infer-large",
                                                                        "infer-small"))
        assert large["NVIDIA_VISIBLE_DEVICES"] == small["NVIDIA_VISIBLE_DEVICES"] != ""
        assert (large["GPU_PORTION"], small["GPU_PORTION"]) == ("0.70", "0.20")

        ray = _wait_running(dev_state, "ray.io/cluster=raycluster-half-gpu", 3, proc)
        workers = [p for p in ray if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
        envs = [_configmap_env(dev_state, w) for w in workers]
        assert len(workers) == 2
        assert envs[0]["NVIDIA_VISIBLE_DEVICES"] == envs[1]["NVIDIA_VISIBLE_DEVICES"] != ""
        assert {e["GPU_PORTION"] for e in envs} == {"0.50"}
        assert workers[0]["spec"]["nodeName"] == workers[1]["spec"]["nodeName"]
        # one reservation pod per shared device, each reported
        res = kubectl(dev_state, "get", "pods", "-n", "kai-resource-reservation")["items"]
        devices = {p["metadata"]["annotations"]["run.ai/reserve_for_gpu_index"] for p in res}
        seen = [(p["metadata"]["name"], p["metadata"]["labels"].get("runai-gpu-group"),
                 p["metadata"]["annotations"].get("run.ai/reserve_for_gpu_index"),
                 p["metadata"].get("deletionTimestamp")) for p in res]
        assert devices == {large["NVIDIA_VISIBLE_DEVICES"], envs[0]["NVIDIA_VISIBLE_DEVICES"]}, (
            f"reservation pods {seen}; groups {groups}, ray workers "
            f"{[w['metadata']['labels'].get('runai-gpu-group') for w in workers]}\n"
            f"{proc.log_tail(120)}")
    finally:
        proc.stop()
