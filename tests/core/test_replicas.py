"""Multi-host replicas (pods sharing `Pod.replica`): above the podset minimum a replica is placed
whole or not at all and evicted whole; below it, whole replicas fill the minimum first."""

from __future__ import annotations

import pytest

from kai_ray.core.model import (
    Job,
    Node,
    Pod,
    PodStatus,
    Queue,
    Request,
    ResourceQuota,
    SchedulerConfig,
    Snapshot,
    SubGroup,
)
from kai_ray.core.schedule import schedule

# every test here on both cores, each named in its id (tests/core/conftest.py)
pytestmark = pytest.mark.usefixtures("each_core")

OPEN = ResourceQuota(-1, -1, 1)
GPU = Request(cpu_m=500, memory=10**9, gpus=1)
CPU = Request(cpu_m=500, memory=10**9)
QUEUES = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
          Queue("q", parent="root", gpu=OPEN, cpu=OPEN, memory=OPEN))


def _host(name: str, replica: str, status: PodStatus = PodStatus.PENDING,
          node: str | None = None, created: float = 0.0) -> Pod:
    return Pod(name, GPU, status=status, node=node, subgroup="tpu", replica=replica,
               created=created)


def _ray_job(workers: tuple[Pod, ...], min_hosts: int = 2, name: str = "ray",
             priority: int = 50, head_running: bool = True) -> Job:
    head = Pod(f"{name}-head", CPU, status=PodStatus.RUNNING if head_running else
               PodStatus.PENDING, node="n0" if head_running else None, subgroup="headgroup",
               is_ray_head=True)
    return Job(name, "q", priority, (head, *workers), min_member=1 + min_hosts,
               subgroups=(SubGroup("headgroup", 1), SubGroup("tpu", min_hosts)))


def _bound(snapshot: Snapshot, config: SchedulerConfig | None = None) -> set[str]:
    return {b.pod for b in schedule(snapshot, config or SchedulerConfig()).binds}


def test_an_extra_replica_with_room_for_one_host_binds_nothing() -> None:
    running = (_host("a0", "ra", PodStatus.RUNNING, "n0"), _host("a1", "ra", PodStatus.RUNNING,
                                                                   "n0"))
    extra = (_host("b0", "rb"), _host("b1", "rb"))
    job = _ray_job(running + extra)
    tight = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=3),), QUEUES, (job,))
    assert _bound(tight) == set()
    roomy = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=3),
                      Node("n1", 64000, 512 * 10**9, gpus=1)), QUEUES, (job,))
    assert _bound(roomy) == {"b0", "b1"}


def test_without_replica_keys_hosts_are_elastic_one_by_one() -> None:
    """The rule applies only to pods that carry a replica key (single-host groups)."""
    running = tuple(Pod(f"w{i}", GPU, status=PodStatus.RUNNING, node="n0", subgroup="tpu")
                    for i in range(2))
    extra = tuple(Pod(f"x{i}", GPU, subgroup="tpu") for i in range(2))
    job = _ray_job(running + extra)
    snap = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=3),), QUEUES, (job,))
    assert len(_bound(snap)) == 1


def test_the_minimum_is_filled_with_whole_replicas() -> None:
    # created interleaved: task order alone would take host 0 of both replicas first
    workers = (_host("a0", "ra", created=0), _host("b0", "rb", created=1),
               _host("a1", "ra", created=2), _host("b1", "rb", created=3))
    job = _ray_job(workers, head_running=False)
    snap = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=3),), QUEUES, (job,))
    assert _bound(snap) == {"ray-head", "a0", "a1"}


def test_preemption_evicts_an_extra_replica_whole_and_keeps_the_gang() -> None:
    victim = _ray_job((_host("a0", "ra", PodStatus.RUNNING, "n0"),
                       _host("a1", "ra", PodStatus.RUNNING, "n0"),
                       _host("b0", "rb", PodStatus.RUNNING, "n0", created=5),
                       _host("b1", "rb", PodStatus.RUNNING, "n0", created=5)), name="low")
    urgent = Job("high", "q", 100, (Pod("u0", GPU),), min_member=1, created=10)
    snap = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=4),), QUEUES, (victim, urgent))
    result = schedule(snap, SchedulerConfig())
    evicted = {e.pod for e in result.evictions}
    # one GPU was needed, but half a replica is useless: both hosts of the extra replica go
    assert evicted == {"b0", "b1"}, evicted


def test_a_replica_whose_pods_do_not_all_exist_yet_waits() -> None:
    """KubeRay creates a replica's hosts one by one: the first alone must not be placed."""
    running = (_host("a0", "ra", PodStatus.RUNNING, "n0"), _host("a1", "ra", PodStatus.RUNNING,
                                                                   "n0"))
    head = Pod("ray-head", CPU, status=PodStatus.RUNNING, node="n0", subgroup="headgroup",
               is_ray_head=True)
    job = Job("ray", "q", 50, (head, *running, _host("b0", "rb")), min_member=3,
              subgroups=(SubGroup("headgroup", 1), SubGroup("tpu", 2, replica_size=2)))
    snap = Snapshot((Node("n0", 64000, 512 * 10**9, gpus=8),), QUEUES, (job,))
    assert _bound(snap) == set()
    complete = Job("ray", "q", 50, (head, *running, _host("b0", "rb"), _host("b1", "rb")),
                   min_member=3, subgroups=(SubGroup("headgroup", 1),
                                            SubGroup("tpu", 2, replica_size=2)))
    assert _bound(Snapshot(snap.nodes, QUEUES, (complete,))) == {"b0", "b1"}
