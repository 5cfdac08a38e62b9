"""Podsets of minimum 0 (autoscaled Ray groups with minReplicas 0: every pod elastic) and gangs
whose minimum a spec change raised while they ran (`admitted_min_member`): the first are placed
and evicted one pod at a time and never make a gang stale; the second are stale only when members
they were placed with are gone, not because they are asked for more. Each case runs on the Python
core and on the Rust core, which must also decide alike."""

from __future__ import annotations

import dataclasses

import pytest

from kai_ray.core import schedule as core_schedule
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
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import schedule
from kai_ray.testing import native_core

OPEN = ResourceQuota(-1, -1, 1)
QUEUES = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
          Queue("q", parent="root", gpu=OPEN, cpu=OPEN, memory=OPEN))
GPU = Request(cpu_m=500, memory=10**9, gpus=1)
CPU = Request(cpu_m=500, memory=10**9)
GRACE = 60.0
RUNNING = PodStatus.RUNNING


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    native_core.use(native_core.build())
    assert core_schedule.native_core(refresh=True) is not None


def _fields(result: CycleResult) -> dict[str, object]:
    out = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    out.pop("action_seconds")
    return out


def run(snapshot: Snapshot, now: float = 0.0) -> CycleResult:
    """One cycle on each core; both must decide alike, to the letter."""
    config = SchedulerConfig(staleness_grace_period_s=GRACE)
    python = schedule(snapshot, config, now, core="python")
    native = schedule(snapshot, config, now, core="native")
    a, b = _fields(native), _fields(python)
    for name in b:
        assert repr(a[name]) == repr(b[name]), f"{name} differs between the cores"
    return python


def _nodes(gpus: int) -> tuple[Node, ...]:
    return (Node("n0", 64000, 512 * 10**9, gpus=gpus),)


def _ray(workers: tuple[Pod, ...], worker_min: int, *, admitted: int | None = None,
         head_running: bool = True, name: str = "ray", priority: int = 50,
         stale_since: float | None = None) -> Job:
    head = Pod(f"{name}-head", CPU, status=RUNNING if head_running else PodStatus.PENDING,
               node="n0" if head_running else None, subgroup="headgroup", is_ray_head=True)
    return Job(name, "q", priority, (head, *workers), min_member=1 + worker_min,
               subgroups=(SubGroup("headgroup", 1, admitted_min_member=None if admitted is None
                                   else 1),
                          SubGroup("w", worker_min, admitted_min_member=admitted)),
               stale_since=stale_since, last_start=0.0 if head_running else None)


def _w(i: int, running: bool = False, name: str = "ray") -> Pod:
    return Pod(f"{name}-w{i}", GPU, status=RUNNING if running else PodStatus.PENDING,
               node="n0" if running else None, subgroup="w", created=float(i))


# ---- all-elastic podsets ---------------------------------------------------------------------

def test_elastic_workers_past_the_room_place_the_one_that_fits() -> None:
    """The autoscaler asked for 3 more workers; room for 1: it is placed, the others wait, and
    nothing is stale (a podset of minimum 0 is never below it)."""
    job = _ray((_w(0, True), _w(1), _w(2), _w(3)), 0)
    result = run(Snapshot(_nodes(2), QUEUES, (job,)), now=1000.0)
    assert [b.pod for b in result.binds] == ["ray-w1"]
    assert result.evictions == [] and result.stale_set == {}
    assert result.job_status["ray"].pending_pods == ("ray-w2", "ray-w3")


def test_a_new_cluster_with_elastic_workers_starts_with_what_fits() -> None:
    job = _ray((_w(0), _w(1), _w(2)), 0, head_running=False)
    result = run(Snapshot(_nodes(2), QUEUES, (job,)))
    assert {b.pod for b in result.binds} == {"ray-head", "ray-w0", "ray-w1"}


def test_a_head_without_workers_is_not_stale() -> None:
    job = _ray((_w(0), _w(1)), 0, stale_since=0.0)
    result = run(Snapshot(_nodes(0), QUEUES, (job,)), now=10 * GRACE)
    assert result.evictions == [] and result.stale_cleared == ["ray"]


def test_preemption_takes_elastic_workers_before_the_head() -> None:
    low = _ray((_w(0, True), _w(1, True)), 0)
    urgent = Job("high", "q", 100, (Pod("u0", GPU),), created=10.0)
    result = run(Snapshot(_nodes(2), QUEUES, (low, urgent)))
    assert [e.pod for e in result.evictions] == ["ray-w1"]  # the newest worker, alone


# ---- a minimum raised while the gang runs ----------------------------------------------------

def test_a_gang_whose_minimum_was_raised_above_its_running_count_is_not_evicted() -> None:
    """minReplicas 2 -> 4 on a running head + 2 workers with no room for more: the two new
    workers wait; the gang is not stale however long it waits (many grace periods)."""
    job = _ray((_w(0, True), _w(1, True), _w(2), _w(3)), 4, admitted=2)
    snap = Snapshot(_nodes(2), QUEUES, (job,))
    for now in (0.0, GRACE, 3 * GRACE, 10 * GRACE):
        result = run(snap, now)
        assert result.evictions == [] and result.stale_set == {} and result.binds == []
    # stamped stale before (by a scheduler without the record): the stamp is cleared
    result = run(Snapshot(snap.nodes, QUEUES, (dataclasses.replace(job, stale_since=0.0),)),
                 now=10 * GRACE)
    assert result.evictions == [] and result.stale_cleared == ["ray"]


def test_the_raised_minimum_is_still_what_gets_placed() -> None:
    """The record changes staleness only: with room for the 2 missing workers they are placed
    together, and with room for 1 neither is (the raised minimum is a gang)."""
    job = _ray((_w(0, True), _w(1, True), _w(2), _w(3)), 4, admitted=2)
    assert {b.pod for b in run(Snapshot(_nodes(4), QUEUES, (job,))).binds} == {"ray-w2", "ray-w3"}
    assert run(Snapshot(_nodes(3), QUEUES, (job,))).binds == []


def test_without_the_record_the_same_gang_is_evicted_as_in_kai() -> None:
    job = _ray((_w(0, True), _w(1, True), _w(2), _w(3)), 4, stale_since=0.0)
    result = run(Snapshot(_nodes(2), QUEUES, (job,)), now=GRACE)
    assert {e.pod for e in result.evictions} == {"ray-head", "ray-w0", "ray-w1"}
    assert {e.action for e in result.evictions} == {"stalegangeviction"}


def test_a_gang_that_lost_a_running_member_is_evicted_after_the_grace_period() -> None:
    """Minimum 2, one worker died (KubeRay's replacement waits, no room): stale, then evicted."""
    job = _ray((_w(0, True), _w(9)), 2)
    snap = Snapshot(_nodes(1), QUEUES, (job,))
    assert run(snap, now=5.0).stale_set == {"ray": 5.0}
    stamped = Snapshot(snap.nodes, QUEUES, (dataclasses.replace(job, stale_since=5.0),))
    assert run(stamped, now=5.0 + GRACE - 1).evictions == []
    result = run(stamped, now=5.0 + GRACE)
    assert {e.pod for e in result.evictions} == {"ray-head", "ray-w0"}
    assert result.evictions[0].message.startswith(
        "Workload doesn't meet the minimum required number of pods (3)")


def test_a_raised_gang_that_lost_a_member_it_ran_with_is_evicted() -> None:
    job = _ray((_w(0, True), _w(2), _w(3), _w(9)), 4, admitted=2, stale_since=0.0)
    result = run(Snapshot(_nodes(1), QUEUES, (job,)), now=GRACE)
    assert {e.pod for e in result.evictions} == {"ray-head", "ray-w0"}


@pytest.mark.parametrize(("running", "admitted", "stale"),
                         [(2, 2, False), (3, 2, False), (1, 2, True), (2, None, True),
                          (2, 3, True), (2, 0, False)])
def test_a_gang_without_subgroups_counts_against_its_admitted_minimum(
        running: int, admitted: int | None, stale: bool) -> None:
    pods = tuple(Pod(f"p{i}", GPU, status=RUNNING if i < running else PodStatus.PENDING,
                     node="n0" if i < running else None) for i in range(4))
    job = Job("j", "q", 50, pods, min_member=4, admitted_min_member=admitted, last_start=0.0)
    result = run(Snapshot(_nodes(running), QUEUES, (job,)), now=1.0)
    assert result.stale_set == ({"j": 1.0} if stale else {})
