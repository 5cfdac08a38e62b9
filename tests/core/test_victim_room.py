"""The solver's idle-GPU filter (`GpuRoom`), counting victims as they are added or for one
scenario alone, must answer exactly like a greedy match written out from KAI's description,
over every node and device, computed from scratch."""

from __future__ import annotations

import random

import pytest

from kai_ray.core.actions import allocate
from kai_ray.core.actions.gpu_room import GpuRoom, free_gpus
from kai_ray.core.jobs import Task
from kai_ray.core.model import (
    MILLI,
    Job,
    Node,
    Pod,
    PodStatus,
    Queue,
    Request,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.state import Session
from kai_ray.sim.synthetic import OPEN, cluster


def _greedy(needs: list[int], places: list[int]) -> bool:
    places = sorted(places, reverse=True)
    for need in sorted(needs, reverse=True):
        if not places or places[0] < need:
            return False
        places[0] -= need
        places.sort(reverse=True)
    return True


def _plain_rooms(sess: Session) -> dict[tuple[int, str], int]:
    """Room per live shared device with some, over every schedulable node."""
    cluster = sess.cluster
    return {(n, g.gid): MILLI - g.used + g.releasing
            for n in range(len(cluster.nodes)) if cluster.schedulable[n]
            for g in cluster.groups[n].values()
            if g.releasing < g.used and MILLI - g.used + g.releasing > 0}


def _reference(sess: Session, prefix: list[Task], victims: list[Task]) -> bool:
    """Free whole GPUs per node and room per shared device after `victims` go, then the
    whole requests greedily, then the fractions into device rooms and the spare whole GPUs."""
    cluster = sess.cluster
    whole = {n: int(cluster.free_gpu()[n])
             for n in range(len(cluster.nodes)) if cluster.schedulable[n]}
    rooms = _plain_rooms(sess)
    freed: dict[tuple[int, str], int] = {}
    for t in victims:
        if t.node < 0 or not cluster.schedulable[t.node]:
            continue
        if t.req.gpus:
            whole[t.node] += t.req.gpus
            continue
        for gid in t.groups:
            key = (t.node, gid)
            before = freed.get(key, 0)
            freed[key] = before + t.gpu_mem_cost
            group = cluster.groups[t.node][gid]
            if before + group.releasing >= group.used:
                continue  # freed whole already: one GPU, however many more sharers go
            if freed[key] + group.releasing >= group.used:
                whole[t.node] += 1
                rooms.pop(key, None)
            else:
                rooms[key] = MILLI - group.used + group.releasing + freed[key]
    whole_needs = [t.req.gpus for t in prefix if t.req.gpus]
    widest = int(cluster.gpu_mem.argmax())
    fractions = [cluster.device_cost(t.req, widest) for t in prefix
                 for _ in range(t.req.fraction_devices) if t.req.is_shared]
    places = list(whole.values())
    if not _greedy(whole_needs, places):
        return False
    spare = sum(whole.values()) - sum(whole_needs)
    return _greedy(fractions, [r for r in rooms.values() if r > 0] + [MILLI] * spare)


@pytest.mark.parametrize("seed", range(6))
def test_room_matches_a_plain_greedy_match(seed: int) -> None:
    rng = random.Random(seed)
    sess = Session(cluster(12, seed=seed, pending_per_node=10), SchedulerConfig(), 0.0)
    running = [t for t in sess.tasks if t.status == PodStatus.RUNNING]
    allocate.run(sess)  # fill the cluster: room must then come from victims
    pending = [t for t in sess.tasks if t.status == PodStatus.PENDING]
    # some running pods already releasing, so devices have releasing parts too
    for t in rng.sample(running, len(running) // 6):
        sess.statement.evict(t)
    candidates = [t for t in running if t.status == PodStatus.RUNNING]
    base = free_gpus(sess)
    checked = 0
    for _ in range(120):
        # fractional-only prefixes half the time: they need device rooms or spare whole GPUs
        pool = rng.choice([pending, [t for t in pending if t.req.is_shared] or pending])
        prefix = rng.sample(pool, rng.randint(1, min(16, len(pool))))
        victims = rng.sample(candidates, rng.randint(0, min(24, len(candidates))))
        if rng.random() < 0.5:
            # every pod of a few nodes: shared devices free up entirely
            nodes = set(rng.sample(range(len(sess.cluster.nodes)), 3))
            victims = [t for t in candidates if t.node in nodes]
        room = GpuRoom(sess, base, prefix)
        expected = _reference(sess, prefix, victims)
        assert room.enough_with(victims) == expected
        for t in victims:
            room.add_victim(t)
        assert room.enough() == expected
        checked += expected
    assert 0 < checked < 120  # both answers occur, so the comparison means something


def test_a_device_freed_entirely_is_a_whole_gpu_not_also_its_old_room() -> None:
    """Two GPUs: one shared by a half pod (room 500), one by a 0.75 pod (room 250). Evicting
    the half leaves a whole GPU and the 250 room: 0.75 then 0.5 no longer fit (counting the
    freed device's old room as well would say they do)."""
    node = Node(name="n0", cpu_m=64_000, memory=256 * 10**9, gpus=2, gpu_memory_mib=81920)
    running = tuple(
        Pod(name, Request(cpu_m=100, memory=10**9, gpu_fraction_milli=milli),
            status=PodStatus.RUNNING, node="n0", gpu_groups=(group,))
        for name, milli, group in (("half", 500, "n0-dev0"), ("big", 750, "n0-dev1")))
    pending = tuple(Pod(f"p{i}", Request(cpu_m=100, memory=10**9, gpu_fraction_milli=m))
                    for i, m in enumerate((750, 500)))
    snapshot = Snapshot(
        nodes=(node,), queues=(Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),),
        jobs=(Job("running", queue="q", priority=50, pods=running, min_member=2),
              Job("new", queue="q", priority=50, pods=pending, min_member=2)))
    sess = Session(snapshot, SchedulerConfig(), 0.0)
    victim = next(t for t in sess.tasks if t.name == "half")
    prefix = [t for t in sess.tasks if t.status == PodStatus.PENDING]
    assert _reference(sess, prefix, [victim]) is False
    assert _reference(sess, prefix[:1], [victim]) is True
    room = GpuRoom(sess, free_gpus(sess), prefix)
    assert room.enough_with([victim]) is False
    room.add_victim(victim)
    assert room.enough() is False
    assert GpuRoom(sess, free_gpus(sess), prefix[:1]).enough_with([victim]) is True


def test_a_device_freed_whole_is_one_gpu_however_many_sharers_go() -> None:
    """Three 0.5 pods pipelined onto one device (pipelined pods are charged to releasing room,
    so a device can take more of them than it holds) and the node's other GPU idle. Taking
    two of them back frees the device whole: two free GPUs. Taking the third as well frees
    nothing more, so three whole-GPU pods still do not fit (a count per sharer after the
    first whole said they did)."""
    node = Node(name="n0", cpu_m=64_000, memory=256 * 10**9, gpus=2, gpu_memory_mib=81920)
    sharers = tuple(Pod(f"s{i}", Request(cpu_m=100, memory=10**9, gpu_fraction_milli=500))
                    for i in range(3))
    wholes = tuple(Pod(f"w{i}", Request(cpu_m=100, memory=10**9, gpus=1)) for i in range(3))
    snapshot = Snapshot(
        nodes=(node,), queues=(Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),),
        jobs=(Job("shared", queue="q", priority=50, pods=sharers, min_member=1),
              Job("whole", queue="q", priority=50, pods=wholes, min_member=3)))
    sess = Session(snapshot, SchedulerConfig(), 0.0)
    shared = [t for t in sess.tasks if t.name.startswith("s")]
    for t in shared:
        sess.statement.allocate(t, 0, ("n0-dev0",), pipelined=True)
    base = free_gpus(sess)
    assert base == ({0: 1}, {})  # a device only pipelined sharers hold is in neither sum
    prefix = [t for t in sess.tasks if t.name.startswith("w")]
    assert GpuRoom(sess, base, prefix[:2]).enough_with(shared[:2]) is True
    room = GpuRoom(sess, base, prefix)
    assert room.enough_with(shared[:2]) is False
    assert room.enough_with(shared) is False
    for t in shared:
        room.add_victim(t)
    assert room.enough() is False
