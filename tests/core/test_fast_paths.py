"""The Rust core's shortcuts must not change a single decision: choosing among the few nodes
its GPU room index leaves, walking many by free GPUs for binpack, choosing among a victim
scenario's nodes one by one, the binpack carry-over, and the victim stream popped once per state
and carried over, against the Python core, which has none of them (every choice a pass over
every node, every search a fresh victim order). The clusters here are made to reach those
paths: busy nodes, many candidates, gangs taken a pod at a time. Each cycle is run on both
cores and compared in full; the Python core's own bookkeeping is checked too."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kai_ray.core import schedule as core_schedule
from kai_ray.core.model import PodStatus, Request, SchedulerConfig, Snapshot
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import schedule, set_default_core
from kai_ray.core.state import Session
from kai_ray.core.statement import Statement
from kai_ray.sim.runner import advance
from kai_ray.sim.synthetic import cluster
from kai_ray.testing import native_core


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    native_core.use(native_core.build())
    assert core_schedule.native_core(refresh=True) is not None


@pytest.fixture(autouse=True)
def python_core():  # type: ignore[no-untyped-def]
    """Tests that patch the Python core's session run it, not the Rust core."""
    before = set_default_core("python")
    yield
    set_default_core(before)


def _decisions(result: CycleResult) -> tuple[object, ...]:
    return (result.binds, result.pipelined, result.evictions, result.job_status, result.pods,
            result.queues)


def _both_ways(snapshot: Snapshot, config: SchedulerConfig, now: float
               ) -> tuple[CycleResult, CycleResult]:
    """(the Rust core's result, the Python core's)."""
    return (schedule(snapshot, config, now, core="native"),
            schedule(snapshot, config, now, core="python"))


def _config(spread: bool) -> SchedulerConfig:
    strategy = "spread" if spread else "binpack"
    return SchedulerConfig(placement=dataclasses.replace(SchedulerConfig().placement,
                                                         gpu=strategy, cpu=strategy))


def _gangs_of_running(snapshot: Snapshot, seed: int, whole: bool = False) -> Snapshot:
    """The running single pods of a synthetic cluster joined into elastic gangs of 1-4 (pods of
    one gang may sit on different nodes and share devices with other gangs), so victims are
    taken a pod at a time and recorded victims leave part of their job behind (with `whole`,
    every gang is at its minimum: taken whole)."""
    rng = random.Random(seed)
    running = [j for j in snapshot.jobs if j.name.startswith("pg-run-")]
    jobs = [j for j in snapshot.jobs if not j.name.startswith("pg-run-")]
    while running:
        size = rng.randint(1, 4)
        chunk, running = running[:size], running[size:]
        pods = tuple(p for j in chunk for p in j.pods)
        minimum = len(pods) if whole else rng.randint(1, len(pods))
        jobs.append(dataclasses.replace(chunk[0], pods=pods, min_member=minimum))
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 40), seed=st.integers(0, 10**6), pending=st.integers(1, 12),
       queues=st.integers(1, 4), spread=st.booleans(), gangs=st.booleans())
# reclaim across queues where a recorded victim's job is a gang that is not all recorded
@example(nodes=23, seed=861, pending=6, queues=4, spread=False, gangs=False)
# jobs a success touched come back into the carried-over victim stream with their new units
@example(nodes=32, seed=24, pending=4, queues=2, spread=False, gangs=False)
def test_same_decisions_on_busy_clusters(nodes, seed, pending, queues, spread, gangs):
    snapshot = cluster(nodes, seed=seed, pending_per_node=pending, queues=queues)
    if gangs:
        snapshot = _gangs_of_running(snapshot, seed)
    config = _config(spread)
    fast, plain = _both_ways(snapshot, config, 0.0)
    assert _decisions(fast) == _decisions(plain)
    # the next cycle starts from those decisions carried out: pipelined and releasing pods
    later = advance(snapshot, fast)
    fast, plain = _both_ways(later, config, 1.0)
    assert _decisions(fast) == _decisions(plain)


def _some_releasing(snapshot: Snapshot) -> Snapshot:
    """Every fifth running pod already on its way out: nodes that fit only with what is
    releasing (pipelining), next to nodes that fit on idle resources."""
    jobs = []
    for i, job in enumerate(snapshot.jobs):
        if job.name.startswith("pg-run-") and i % 5 == 0:
            job = dataclasses.replace(job, pods=tuple(
                dataclasses.replace(p, status=PodStatus.RELEASING) for p in job.pods))
        jobs.append(job)
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


def _half_used_devices(snapshot: Snapshot) -> Snapshot:
    """On each shared device of the running pods, the first sharer takes a quarter instead of
    a half, and on every other node the second one is releasing: devices with room that a
    fractional pod can have only once a releasing sharer is gone."""
    jobs = []
    for job in snapshot.jobs:
        pod = job.pods[0]
        if job.name.startswith("pg-run-") and pod.request.gpu_fraction_milli:
            node, sharer = int(job.name.split("-")[2]), job.name.rsplit("-", 1)[1]
            if sharer == "0":
                pod = dataclasses.replace(pod, request=dataclasses.replace(
                    pod.request, gpu_fraction_milli=250))
            elif node % 2 == 0:
                pod = dataclasses.replace(pod, status=PodStatus.RELEASING)
            job = dataclasses.replace(job, pods=(pod,))
        jobs.append(job)
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


@pytest.mark.parametrize("seed,half_used", [(0, False), (1, False), (2, False), (3, True),
                                            (4, True)])
def test_same_decisions_with_many_candidate_nodes(seed, half_used):
    """Clusters big enough that allocate sees more than the Rust core's few-node limit of nodes
    with room (its binpack walks), then a second cycle with releasing pods."""
    snapshot = _some_releasing(cluster(120, seed=seed, pending_per_node=6, queues=3))
    if half_used:
        snapshot = _half_used_devices(snapshot)
    fast, plain = _both_ways(snapshot, _config(False), 0.0)
    assert _decisions(fast) == _decisions(plain)
    later = advance(snapshot, fast)
    fast, plain = _both_ways(later, _config(False), 1.0)
    assert _decisions(fast) == _decisions(plain)


def test_a_rolled_back_placement_does_not_steer_the_next():
    """After a rollback the session is as it was: here node-0 becomes the fuller node, and the
    next pod must go there, not to node-1 where the rolled-back pod went. The Python core's own
    session; the Rust core's binpack carry-over, keyed by the undo log's length (the same here),
    is not reached by this test: only the whole-cycle comparisons cover it."""
    from kai_ray.core.actions.common import place_tasks
    from kai_ray.core.model import Job, Node, Pod, Queue
    from kai_ray.sim.synthetic import OPEN

    def pod(name: str, gpus: int, cpu: int) -> Pod:
        return Pod(name, Request(cpu_m=cpu, memory=10**9, gpus=gpus), created=0.0)

    snapshot = Snapshot(
        nodes=(Node("node-0", cpu_m=64_000, memory=10**12, gpus=3),
               Node("node-1", cpu_m=64_000, memory=10**12, gpus=2)),
        queues=(Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),),
        jobs=(Job("x", queue="q", priority=50, pods=(pod("x-0", 1, 1000),)),
              Job("y", queue="q", priority=50, pods=(pod("y-0", 2, 2000),)),
              Job("z", queue="q", priority=50, pods=(pod("z-0", 1, 1000),))))
    sess = Session(snapshot, SchedulerConfig(), 0.0)
    x, y, z = (sess.jobs[name] for name in ("x", "y", "z"))
    base = sess.statement.checkpoint()
    assert place_tasks(sess, x, x.pending_tasks(), pipeline_only=False)
    assert x.tasks[0].node == 1  # binpack: the fuller node
    sess.statement.rollback(base)
    # node-0 now has 1 free GPU, node-1 still 2
    sess.statement.allocate(y.tasks[0], 0, (), pipelined=False)
    assert len(sess.statement.undo) == base + 1
    assert place_tasks(sess, z, z.pending_tasks(), pipeline_only=False)
    assert z.tasks[0].node == 0


def test_a_cycle_leaves_the_garbage_collector_as_it_found_it():
    """`schedule` pauses the cyclic collector for the cycle only, also when it raises."""
    import gc

    snapshot = cluster(5, seed=0)
    assert gc.isenabled()
    schedule(snapshot, SchedulerConfig(), 0.0)
    assert gc.isenabled()
    gc.disable()
    try:
        schedule(snapshot, SchedulerConfig(), 0.0)
        assert not gc.isenabled()  # a caller that paused it keeps it paused
    finally:
        gc.enable()
    bad = dataclasses.replace(SchedulerConfig(), actions=("allocate", "no-such-action"))
    with pytest.raises(ValueError):
        schedule(snapshot, bad, 0.0)
    assert gc.isenabled()


def test_the_fraction_walk_does_not_settle_early_among_many_sharing_nodes():
    """More than the Rust core's few-node limit (48) of nodes have a partly used device the pod
    fits on, but only ones past the first 48 have CPU for it: the winner is one of those
    (sharing bonus), not the roomy node its walk over every candidate would meet first."""
    from kai_ray.core.model import Job, Node, Pod, Queue
    from kai_ray.sim.synthetic import OPEN

    nodes = tuple(Node(f"node-{i:02d}", cpu_m=8000, memory=10**12, gpus=2) for i in range(80))
    jobs = []
    for i in range(80):
        if i < 20:  # no shared device, one whole GPU busy: free 1, fits on idle
            req = Request(cpu_m=1000, memory=10**9, gpus=1)
        else:  # a half-used shared device (free 1); the first 50 of these have no CPU left
            req = Request(cpu_m=8000 if i < 70 else 1000, memory=10**9, gpu_fraction_milli=500)
        pod = Pod(f"run-{i}", req, status=PodStatus.RUNNING, node=f"node-{i:02d}",
                  gpu_groups=(f"node-{i:02d}-dev0",) if i >= 20 else ())
        jobs.append(Job(f"pg-run-{i}", queue="q", priority=50, pods=(pod,), created=-1.0))
    pending = Pod("quarter-0", Request(cpu_m=1000, memory=10**9, gpu_fraction_milli=250))
    jobs.append(Job("quarter", queue="q", priority=50, pods=(pending,)))
    snapshot = Snapshot(nodes=nodes, queues=(Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),),
                        jobs=tuple(jobs))
    fast, plain = _both_ways(snapshot, _config(False), 0.0)
    assert _decisions(fast) == _decisions(plain)
    assert fast.pods["quarter-0"].node == "node-70"


def _check_gpu_arrays(sess: Session) -> None:
    """The per-node GPU arrays, kept up to date pod by pod, against the same numbers counted
    again from the nodes' devices."""
    cluster = sess.cluster
    for n in range(len(cluster.nodes)):
        groups = list(cluster.groups[n].values())
        # a device with an unpipelined sharer is used, releasing if they all are; one only
        # pipelined sharers hold is taken from releasing (KAI's charge of a Pipelined pod),
        # unless an unpipelined sharer opened it (Group.from_idle)
        held = [g.used > 0 or g.from_idle for g in groups]
        used = int(cluster.whole_used[n]) + sum(held)
        rel = (int(cluster.whole_rel[n])
               + sum(1 for g in groups if g.used > 0 and g.used == g.releasing)
               - held.count(False))
        assert (int(cluster.used_gpu[n]), int(cluster.rel_gpu[n])) == (used, rel), n
        width = cluster.dev_used.shape[1]
        assert cluster.dev_on[n].tolist() == [True] * len(groups) + [False] * (width - len(groups))
        assert cluster.dev_used[n, :len(groups)].tolist() == [g.used for g in groups]
        assert cluster.dev_rel[n, :len(groups)].tolist() == [g.releasing for g in groups]


def _after_each_decision(patch: pytest.MonkeyPatch, names: tuple[str, ...],
                         check: Callable[[Session, str], None]) -> None:
    """`check(session, name)` after each call of the Statement's methods `names` (the session
    is the one whose statement it is: recorded as sessions are made)."""
    sessions: list[Session] = []
    init = Session.__init__

    def recording_init(self: Session, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        sessions.append(self)

    patch.setattr(Session, "__init__", recording_init)
    for name in names:
        method = getattr(Statement, name)

        def wrapper(stmt: Statement, *args: Any, _method: Any = method, _name: str = name,
                    **kwargs: Any) -> Any:
            out = _method(stmt, *args, **kwargs)
            sess = sessions[-1]
            assert sess.statement is stmt
            check(sess, _name)
            return out

        patch.setattr(Statement, name, wrapper)


@pytest.mark.parametrize("seed", [1, 5, 7])
def test_the_gpu_arrays_follow_every_change(seed):
    """Checked after every allocation, eviction and rollback of a cycle (whole-GPU and
    fractional pods, devices with releasing sharers, victim simulations)."""
    checks = []

    def check(sess: Session, name: str) -> None:
        _check_gpu_arrays(sess)
        checks.append(name)

    snapshot = _half_used_devices(_some_releasing(cluster(20, seed=seed, pending_per_node=8,
                                                          queues=1)))
    with pytest.MonkeyPatch.context() as patch:
        _after_each_decision(patch, ("allocate", "evict", "rollback"), check)
        result = schedule(snapshot, _config(False), 0.0)
    assert result.evictions
    assert {name: checks.count(name) >= 50 for name in ("allocate", "evict", "rollback")} == {
        "allocate": True, "evict": True, "rollback": True}


def test_shape_numbers_match_request_and_constraints():
    """`Session.shape_of` (what allocate's failed shapes compare)
    is equal exactly when the request and the constraints are."""
    snap = _half_used_devices(cluster(30, seed=3, pending_per_node=6))
    sess = Session(snap, _config(False), 0.0)
    tasks = sess.tasks
    rng = random.Random(0)
    pairs = [(rng.choice(tasks), rng.choice(tasks)) for _ in range(3000)]
    pairs += list(itertools.pairwise(tasks))  # neighbours: mostly the same gang
    shape = sess.shape_of
    assert any(shape(a) == shape(b) and a is not b for a, b in pairs)
    assert any(shape(a) != shape(b) for a, b in pairs)
    for a, b in pairs:
        assert (shape(a) == shape(b)) == (a.req == b.req and a.constraints == b.constraints)


def test_no_task_becomes_pending_during_a_cycle():
    """The jobs with a pending task when the cycle starts hold every job with a pending task at
    any point of it (the Rust core's passes over pending work take only those: `pending_jobs`
    in state.rs): checked after every change of state."""
    seen = []
    snapshot = _half_used_devices(_some_releasing(cluster(20, seed=1, pending_per_node=8,
                                                          queues=1)))
    known = {job.name for job in snapshot.jobs
             if any(pod.status == PodStatus.PENDING for pod in job.pods)}

    def check(sess: Session, name: str) -> None:
        assert all(job.name in known for job in sess.jobs.values() if job.has_pending())
        seen.append(name)

    with pytest.MonkeyPatch.context() as patch:
        _after_each_decision(patch, ("allocate", "evict", "unevict", "set_status", "rollback"),
                             check)
        result = schedule(snapshot, _config(False), 0.0)
    assert result.evictions and result.job_status  # victims taken, work left pending
    assert {"allocate", "evict", "rollback"} <= set(seen)
