"""`kai-ray run` against the real control plane with KWOK GPU nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.integration.helpers import (
    create_queues,
    delete_queues,
    gang,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)

pytestmark = pytest.mark.integration
DATA = Path(__file__).parent / "data"


def _running(core: client.CoreV1Api, ns: str, names: list[str]) -> bool:
    return all(pod_phase(core, ns, n)[0] == "Running" for n in names)


def test_kai_quickstart_pods_run_and_share_a_device(cluster, gpu_nodes, namespace,
                                                      kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for doc in yaml.safe_load_all((DATA / "kai-default-queues.yaml").read_text()):
        try:
            custom.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", doc)
        except client.ApiException as e:
            assert e.status == 409
    # KAI's quick-start shapes: a whole GPU, two half GPUs, a gpu-memory request
    whole = pod("gpu-pod", "default-queue", gpus=1)
    halves = [pod(f"half-{i}", "default-queue", annotations={"gpu-fraction": "0.5"})
              for i in range(2)]
    memory = pod("memory-pod", "default-queue", annotations={"gpu-memory": "2000"})
    for p in (whole, *halves, memory):
        core.create_namespaced_pod(namespace, p)
    names = ["gpu-pod", "half-0", "half-1", "memory-pod"]
    wait_for("all quick-start pods Running", lambda: _running(core, namespace, names),
             timeout=90, detail=kai_scheduler.log_tail)

    got = {n: core.read_namespaced_pod(n, namespace) for n in names}
    groups = {n: (got[n].metadata.labels or {}).get("runai-gpu-group") for n in names}
    assert groups["half-0"] and groups["half-0"] == groups["half-1"], groups
    assert got["half-0"].spec.node_name == got["half-1"].spec.node_name
    assert groups["memory-pod"] and groups["gpu-pod"] is None

    def env_of(name: str) -> dict[str, str]:
        prefix = got[name].metadata.annotations["runai/shared-gpu-configmap"]
        cms = [c for c in core.list_namespaced_config_map(namespace).items
               if c.metadata.name.startswith(prefix)]
        assert len(cms) == 1, [c.metadata.name for c in cms]
        return cms[0].data

    a, b = env_of("half-0"), env_of("half-1")
    assert a["NVIDIA_VISIBLE_DEVICES"] == b["NVIDIA_VISIBLE_DEVICES"] != ""
    assert a["GPU_PORTION"] == "0.50"
    mem = env_of("memory-pod")
    assert mem["KAI_RAY_GPU_MEMORY_LIMIT_MIB"] == "2000"
    # one reservation pod pins each shared device
    reservations = core.list_namespaced_pod("kai-resource-reservation",
                                            label_selector=f"runai-gpu-group={groups['half-0']}")
    assert len(reservations.items) == 1
    events = core.list_namespaced_event(namespace, field_selector="reason=Scheduled").items
    assert {e.involved_object.name for e in events} >= set(names)


def test_gang_waits_whole_then_binds_in_one_cycle(cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    qname = f"gang-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    try:
        names = gang(api, namespace, "train", qname, size=5, gpus=1,
                     node_selector={"kai-ray.io/pool": pool})
        cond = wait_for("an Unschedulable condition on the gang's pods",
                        lambda: scheduled_condition(core, namespace, names[0]),
                        detail=kai_scheduler.log_tail)
        assert cond.status == "False" and cond.reason == "Unschedulable"
        assert "gang" in cond.message and "5" in cond.message, cond.message
        # nothing of the gang may be bound while it cannot fit whole
        assert all(pod_phase(core, namespace, n)[1] is None for n in names)
        pool_nodes(api, 1, gpus=4, pool=pool, start=1)
        wait_for("all 5 gang pods bound", lambda: all(
            pod_phase(core, namespace, n)[1] for n in names), timeout=30,
            detail=kai_scheduler.log_tail)
        nodes = {pod_phase(core, namespace, n)[1] for n in names}
        assert nodes <= {f"{pool}-0", f"{pool}-1"}
    finally:
        delete_queues(api, created)
