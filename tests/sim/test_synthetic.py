"""The benchmark clusters are what their docs say, and the busy one gives every action work."""

from __future__ import annotations

import collections

import pytest

from kai_ray.core.model import PodStatus
from kai_ray.core.schedule import schedule
from kai_ray.sim.synthetic import GPUS_PER_NODE, busy_cluster, cluster


def test_issue_workload_is_half_full_with_ten_pending_pods_per_node() -> None:
    snap = cluster(40)
    pods = [p for j in snap.jobs for p in j.pods]
    running = [p for p in pods if p.status == PodStatus.RUNNING]
    gpus = sum(p.request.gpus + p.request.gpu_fraction_milli / 1000 for p in running)
    assert gpus == 40 * GPUS_PER_NODE / 2
    pending = [p for p in pods if p.node is None]
    assert 40 * 10 <= len(pending) < 40 * 10 + 16


@pytest.mark.parametrize("nodes,seed", [(60, 0), (200, 1)])
def test_busy_cluster_is_mostly_running_and_its_pending_work_gets_room(nodes: int,
                                                                         seed: int) -> None:
    snap = busy_cluster(nodes, seed=seed)
    per_node: collections.Counter[str] = collections.Counter()
    gpus: collections.Counter[str] = collections.Counter()
    pending = []
    for job in snap.jobs:
        for pod in job.pods:
            if pod.node is None:
                pending.append(pod)
                continue
            per_node[pod.node] += 1
            gpus[pod.node] += pod.request.gpus * 1000 + pod.request.gpu_fraction_milli
    assert set(per_node.values()) == {27}  # 5 + 2 sharers + 20 CPU pods
    assert set(gpus.values()) == {6000}  # 6 of 8 GPUs: no node has room for a 4-GPU pod
    assert len(pending) == 42

    result = schedule(snap, now=0.0)
    assert sorted(b.job.rsplit("-", 1)[0] for b in result.binds) == ["halves"] * 16
    waiting = sorted(p.job.rsplit("-", 1)[0] for p in result.pipelined
                     if not p.job.startswith("pg-"))
    assert waiting == ["preemptor"] * 6 + ["reclaimer"] * 20  # on their victims' GPUs
    assert result.job_status == {}  # nothing left pending
    queue_of = {j.name: j.queue for j in snap.jobs}
    assert {e.action for e in result.evictions} <= {"reclaim", "consolidation"}
    # a reclaimer's victims come from other queues
    assert all(queue_of[e.job] != queue_of[e.preemptor]
               for e in result.evictions if e.action == "reclaim")
    assert len(result.evictions) >= 2 * 26  # 2 GPUs freed per 4-GPU pod at least
