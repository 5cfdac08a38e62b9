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
