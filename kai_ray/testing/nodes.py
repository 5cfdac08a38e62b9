"""KWOK GPU nodes: Node objects that the KWOK controller keeps Ready.

The labels are the ones NVIDIA's GPU feature discovery puts on real nodes and KAI reads
(`nvidia.com/gpu.count`, `nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.product`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

#: the annotation KWOK's controller is told to select (kwok --manage-nodes-with-annotation-selector)
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
DEFAULT_GPU_MEMORY_MIB = 81920
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def node_ip(index: int) -> str:
    """A distinct fake InternalIP per node (KWOK reports it as the pods' hostIP)."""
    return f"10.250.{index // 250}.{index % 250 + 1}"


def gpu_node_manifest(name: str, index: int, gpus: int, *, cpu: str = "64",
                      memory: str = "512Gi", pods: int = 110,
                      gpu_product: str = DEFAULT_GPU_PRODUCT,
                      gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
                      labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node object for KWOK with `gpus` whole nvidia.com/gpu devices."""
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods),
                 "ephemeral-storage": "1Ti", "nvidia.com/gpu": str(gpus)}
    node_labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true" if gpus else "false",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(gpu_memory_mib),
        "nvidia.com/gpu.product": gpu_product,
        **(labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                            "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        # The apiserver keeps status on create (as when a kubelet registers its node); KWOK's
        # node stage then copies capacity/allocatable into the Ready status it writes.
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "addresses": [{"type": "InternalIP", "address": node_ip(index)},
                          {"type": "Hostname", "address": name}],
        },
    }


def create_gpu_nodes(api: client.ApiClient, count: int, gpus_per_node: int, *,
                     prefix: str = "kwok-gpu-", start: int = 0, **kwargs: Any) -> list[str]:
    """Create `count` KWOK GPU nodes named <prefix><i>; existing ones are left as they are."""
    core = client.CoreV1Api(api)
    names = []
    for i in range(start, start + count):
        name = f"{prefix}{i}"
        try:
            core.create_node(gpu_node_manifest(name, i, gpus_per_node, **kwargs))
        except ApiException as e:
            if e.status != 409:
                raise
        names.append(name)
    return names


def node_ready(node: client.V1Node) -> bool:
    """Ready=True and the admission-time not-ready taint already lifted."""
    conditions = (node.status.conditions or []) if node.status else []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = (node.spec.taints or []) if node.spec else []
    return ready and not any(t.key == NOT_READY_TAINT for t in taints)


def wait_nodes_ready(api: client.ApiClient, names: Sequence[str], timeout: float = 60.0) -> None:
    """Block until every named node is Ready and schedulable (raises TimeoutError naming them)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for node in core.list_node().items:
            if node.metadata.name in pending and node_ready(node):
                pending.discard(node.metadata.name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"nodes not Ready (is the KWOK controller running?) after {timeout:.0f}s: "
                f"{', '.join(sorted(pending))}"
            )
        time.sleep(0.1)
