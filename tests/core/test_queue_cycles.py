"""Queues on a parent cycle (their own parent, A -> B -> A, longer) and every queue under one are
left out of the tree like orphans, by both cores alike: their jobs wait with QueueParentCycle,
the rest of the cluster schedules in the same cycle, and nothing hangs (the Python core once
walked a self-parent's path forever)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
)
from kai_ray.core.queuetree import QUEUE_PARENT_CYCLE, excluded_queues, parent_links, queue_cycles
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import schedule
from kai_ray.testing import native_core

pytestmark = pytest.mark.timeout(300)  # a walk that never ends fails here, not the machine

OPEN = ResourceQuota(-1, -1, 1)
NODES = (Node("n1", 64000, 10**12, gpus=8), Node("n2", 64000, 10**12, gpus=8))


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    native_core.use(native_core.build())
    assert core_schedule.native_core(refresh=True) is not None


def both(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """The Python core's result, after checking the native core's is the same field for field
    (as test_native_core does)."""
    python = schedule(snapshot, config, now, core="python")
    native = schedule(snapshot, config, now, core="native")
    for f in dataclasses.fields(CycleResult):
        if f.name != "action_seconds":
            a, b = getattr(native, f.name), getattr(python, f.name)
            assert a == b and repr(a) == repr(b), f"{f.name} differs"
    return python


def q(name: str, parent: str | None = None) -> Queue:
    return Queue(name, parent=parent, gpu=OPEN, cpu=OPEN, memory=OPEN)


def gang(name: str, queue: str, pods: int = 2, gpus: int = 1) -> Job:
    return Job(name, queue, 50, tuple(Pod(f"{name}-{i}", Request(cpu_m=100, gpus=gpus))
                                      for i in range(pods)), min_member=pods)


def run(queues: tuple[Queue, ...], jobs: tuple[Job, ...]) -> CycleResult:
    return both(Snapshot(NODES, queues, jobs), SchedulerConfig(), 0.0)


def test_queue_cycles_names_each_cycle_from_each_of_its_queues() -> None:
    queues = [q("self", "self"), q("a", "b"), q("b", "a"), q("c", "d"), q("d", "e"),
              q("e", "c"), q("kid", "c"), q("grand", "kid"), q("root", ""), q("leaf", "root"),
              q("orphan", "gone"), q("under-orphan", "orphan")]
    assert queue_cycles(queues) == {"a": ("a", "b"), "b": ("b", "a"), "c": ("c", "d", "e"),
                                    "d": ("d", "e", "c"), "e": ("e", "c", "d"),
                                    "self": ("self",)}
    # the same whatever order the queues come in
    assert queue_cycles(reversed(queues)) == queue_cycles(queues)
    # a later queue of a name replaces the earlier one, as the session reads them
    assert queue_cycles([q("x", "x"), q("x")]) == {}
    assert queue_cycles([q("x"), q("x", "x")]) == {"x": ("x",)}
    assert queue_cycles([]) == {}
    why = excluded_queues(parent_links(queues))
    assert sorted(why) == ["a", "b", "c", "d", "e", "grand", "kid", "self"]
    assert why["grand"] == ("Queue 'grand' is under queue 'c', which is on a parent cycle "
                            "(c -> d -> e -> c): left out of the queue tree until a "
                            "spec.parentQueue on the cycle changes")


@pytest.mark.parametrize(("bad", "blocked"), [
    pytest.param((q("loop", "loop"),), {"loop": "(loop -> loop)"}, id="self-parent"),
    pytest.param((q("a", "b"), q("b", "a")), {"a": "(a -> b -> a)", "b": "(b -> a -> b)"},
                 id="two-cycle"),
    pytest.param((q("a", "b"), q("b", "c"), q("c", "a"), q("kid", "b"), q("leaf", "kid")),
                 {"a": "(a -> b -> c -> a)", "c": "(c -> a -> b -> c)",
                  "leaf": "under queue 'b', which is on a parent cycle (b -> c -> a -> b)"},
                 id="three-cycle-with-descendants"),
])
def test_cycle_queues_wait_and_the_healthy_gang_binds_in_the_same_cycle(
        bad: tuple[Queue, ...], blocked: dict[str, str]) -> None:
    healthy = (q("dept"), q("team", "dept"))
    jobs = (gang("ok", "team", pods=2), *(gang(f"j-{name}", name) for name in blocked))
    # the bad queues come first and last: nothing depends on where they are
    result = run(bad + healthy + bad[:1], jobs)
    assert sorted(b.pod for b in result.binds) == ["ok-0", "ok-1"]
    for name, words in blocked.items():
        status = result.job_status[f"j-{name}"]
        assert status.reason == QUEUE_PARENT_CYCLE
        assert f"Queue '{name}'" in status.message and words in status.message, status.message
    assert set(result.queues) == {"dept", "team"}  # the left-out queues get no numbers
    assert "ok" not in result.job_status


def test_running_pods_of_a_cycle_queue_still_hold_their_node() -> None:
    """Its pods keep their GPUs (as an orphan queue's do); nothing is charged to its queues and
    neither core reclaims or preempts for or from them."""
    running = Job("old", "b", 50, tuple(Pod(f"old-{i}", Request(cpu_m=100, gpus=8),
                                            PodStatus.RUNNING, node=f"n{i + 1}")
                                        for i in range(2)), min_member=2)
    queues = (q("a", "b"), q("b", "a"), q("team"))
    result = run(queues, (running, gang("new", "team", pods=1, gpus=4)))
    assert result.binds == [] and result.evictions == []
    assert result.pods["old-0"].status == PodStatus.RUNNING.value
    assert result.job_status["new"].reason != QUEUE_PARENT_CYCLE
    # with room elsewhere the healthy job binds
    roomy = Snapshot((*NODES, Node("n3", 64000, 10**12, gpus=8)), queues,
                     (running, gang("new", "team", pods=1, gpus=4)))
    assert [b.node for b in both(roomy, SchedulerConfig(), 0.0).binds] == ["n3"]


NAMES = ["q0", "q1", "q2", "q3", "q4", "q5"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(NAMES),
                          st.sampled_from([*NAMES, "", None, "missing"])),
                min_size=1, max_size=8))
def test_random_parent_links_leave_out_exactly_what_never_reaches_a_root(
        links: list[tuple[str, str | None]]) -> None:
    queues = tuple(q(name, parent) for name, parent in links)
    parent = {name: p or "" for name, p in links}  # a later queue of a name wins

    def fate(name: str) -> str:  # "root", "orphan" or "cycle", by a bounded walk
        at = name
        for _ in range(len(parent) + 1):
            if not parent[at]:
                return "root"
            if parent[at] not in parent:
                return "orphan"
            at = parent[at]
        return "cycle"

    result = run(queues, tuple(gang(f"j-{name}", name, pods=1) for name in parent))
    for name in parent:
        status = result.job_status.get(f"j-{name}")
        if fate(name) == "root":
            assert name in result.queues
        else:
            assert name not in result.queues
            assert status is not None
            want = QUEUE_PARENT_CYCLE if fate(name) == "cycle" else "QueueDoesNotExist"
            assert status.reason == want, status

    def comes_back(name: str) -> bool:
        at = parent[name]
        for _ in range(len(parent)):
            if at == name:
                return True
            if at not in parent:
                return False
            at = parent[at]
        return False

    on_cycle = {name for name in parent if comes_back(name)}
    assert set(queue_cycles(queues)) == on_cycle
