"""KubeRay's own KAI samples, read unchanged from the KubeRay Go module in the module cache."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grouping_objects import FakeApi, kuberay_pod

from kai_ray.grouping import GroupingConfig, group_pod, resolve_top_owner
from kai_ray.grouping.admission import mutate_pod, queue_parents, validate_pod


def _module_cache() -> Path | None:
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    try:
        out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        return Path(out) if out else None
    except (OSError, subprocess.SubprocessError):
        return Path.home() / "go" / "pkg" / "mod"


def _samples_dir() -> Path | None:
    cache = _module_cache()
    if cache is None:
        return None
    found = []
    for d in (cache / "github.com" / "ray-project" / "kuberay").glob("ray-operator@v*"):
        m = re.fullmatch(r"ray-operator@v(\d+)\.(\d+)\.(\d+)", d.name)
        if m and (d / "config" / "samples" / "ray-cluster.kai-scheduler.yaml").exists():
            found.append((tuple(map(int, m.groups())), d / "config" / "samples"))
    return max(found)[1] if found else None


SAMPLES = _samples_dir()
pytestmark = pytest.mark.skipif(
    SAMPLES is None,
    reason="KubeRay ray-operator module not in the Go module cache "
           "(go mod download github.com/ray-project/kuberay/ray-operator@v1.6.2)",
)


def _load(name: str) -> tuple[dict[str, Any], dict[str, str | None]]:
    assert SAMPLES is not None
    docs = list(yaml.safe_load_all((SAMPLES / name).read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    cluster["metadata"].update(namespace="default", uid="uid-1")  # as stored by the API server
    return cluster, queue_parents([d for d in docs if d["kind"] == "Queue"])


def _pods(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    pods = [kuberay_pod(cluster, "headgroup")]
    for g in cluster["spec"]["workerGroupSpecs"]:
        pods += [kuberay_pod(cluster, g["groupName"], i) for i in range(g["replicas"])]
    return pods


@pytest.mark.parametrize(("sample", "group"), [("ray-cluster.kai-scheduler.yaml", "worker"),
                                               ("ray-cluster.kai-gpu-sharing.yaml", "shared-gpu")])
def test_sample_is_one_gang_of_three_in_team_a(sample: str, group: str) -> None:
    cluster, queues = _load(sample)
    api = FakeApi(cluster)
    results = [group_pod(p, resolve_top_owner(p, api.get_owner), {"train"}) for p in _pods(cluster)]
    assert len(results) == 3 and len({r.name for r in results}) == 1
    spec = results[0].podgroup["spec"]
    assert spec["minMember"] == 3 and spec["queue"] == "team-a"
    assert spec["subGroups"] == [{"name": "headgroup", "minMember": 1},
                                 {"name": group, "minMember": 2}]
    assert [r.subgroup for r in results] == ["headgroup", group, group]
    check = GroupingConfig(validate_queue=True)
    assert all(validate_pod(p, check, queues).allowed for p in _pods(cluster))


def test_gpu_sharing_sample_workers_get_their_own_configmaps() -> None:
    cluster, _ = _load("ray-cluster.kai-gpu-sharing.yaml")
    head, *workers = _pods(cluster)
    assert mutate_pod(head, "abcdefg") == []
    patches = [mutate_pod(w, s) for w, s in zip(workers, ("aaaaaaa", "bbbbbbb"), strict=True)]
    prefixes = [next(op["value"] for op in ops if op["path"].startswith("/metadata/annotations"))
                for ops in patches]
    assert prefixes == ["raycluster-half-gpu-aaaaaaa-shared-gpu",
                        "raycluster-half-gpu-bbbbbbb-shared-gpu"]
    assert all(any(op["path"] == "/spec/containers/0/env" for op in ops) for ops in patches)
