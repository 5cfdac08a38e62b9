"""Invariants of `schedule` on random clusters (hypothesis).

Each example builds a random cluster, lets the core fill part of it (so running pods are placed
by the core itself, consistently), adds new pending work, runs a full cycle again and checks:
no node or device over-committed, gangs placed whole or not at all, limits respected,
non-preemptible jobs never evicted by preempt/reclaim/consolidation, and determinism.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from kai_ray.core.schedule import schedule
from kai_ray.sim.runner import advance

# every test here on both cores, each named in its id (tests/core/conftest.py)
pytestmark = pytest.mark.usefixtures("each_core")

OPEN = ResourceQuota(-1, -1, 1)


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "memory", "cpu"]))
    cpu = draw(st.sampled_from([500, 1000, 4000]))
    mem = draw(st.sampled_from([10**9, 4 * 10**9]))
    if kind == "whole":
        return Request(cpu_m=cpu, memory=mem, gpus=draw(st.integers(1, 4)))
    if kind == "fraction":
        return Request(cpu_m=cpu, memory=mem,
                       gpu_fraction_milli=draw(st.sampled_from([200, 250, 300, 500, 700])),
                       fraction_devices=draw(st.sampled_from([1, 1, 1, 2, 3])))
    if kind == "memory":
        return Request(cpu_m=cpu, memory=mem, gpu_memory_mib=draw(st.sampled_from([2000, 8000])))
    return Request(cpu_m=cpu, memory=mem)


@st.composite
def clusters(draw):
    n_nodes = draw(st.integers(1, 5))
    nodes = tuple(
        Node(name=f"n{i}", cpu_m=draw(st.sampled_from([8000, 16000, 64000])),
             memory=draw(st.sampled_from([32, 64, 256])) * 10**9,
             gpus=draw(st.sampled_from([0, 2, 4, 8])), gpu_memory_mib=16000)
        for i in range(n_nodes))
    n_leaves = draw(st.integers(1, 3))
    queues = [Queue("root", gpu=ResourceQuota(-1, -1, 1), cpu=OPEN, memory=OPEN)]
    for i in range(n_leaves):
        limit = draw(st.sampled_from([-1.0, -1.0, 2.0, 4.0]))
        quota = draw(st.sampled_from([0.0, 1.0, 2.0, 4.0]))
        queues.append(Queue(f"q{i}", parent="root", priority=draw(st.sampled_from([100, 100, 50])),
                            gpu=ResourceQuota(quota, limit, draw(st.sampled_from([0.0, 1.0, 2.0]))),
                            cpu=OPEN, memory=OPEN, created=float(i)))

    def make_jobs(prefix, count, t0):
        jobs = []
        for j in range(count):
            req = draw(requests())
            size = draw(st.integers(1, 4))
            minimum = draw(st.integers(1, size))
            pods = tuple(Pod(f"{prefix}{j}-{k}", req, created=t0 + j) for k in range(size))
            jobs.append(Job(name=f"{prefix}{j}", queue=f"q{draw(st.integers(0, n_leaves - 1))}",
                            priority=draw(st.sampled_from([50, 75, 100, 125])), pods=pods,
                            min_member=minimum, created=t0 + j))
        return jobs

    first = make_jobs("a", draw(st.integers(1, 6)), 0.0)
    later = make_jobs("b", draw(st.integers(1, 6)), 100.0)
    placement = draw(st.sampled_from(["binpack", "spread"]))
    policy = draw(st.sampled_from(["kai", "kai", "lookahead", "fgd", "best_fit"]))
    return nodes, tuple(queues), first, later, (placement, policy)


def _bound(outcome_status: str) -> bool:
    return outcome_status in ("Binding", "Running")


def _check_capacity(snapshot: Snapshot, result) -> None:
    nodes = {n.name: n for n in snapshot.nodes}
    cpu, gpu = defaultdict(int), defaultdict(int)
    groups: dict[tuple[str, str], int] = defaultdict(int)
    for job in snapshot.jobs:
        for pod in job.pods:
            o = result.pods[pod.name]
            if not _bound(o.status):
                continue
            cpu[o.node] += pod.request.cpu_m
            gpu[o.node] += pod.request.gpus
            if pod.request.is_shared:
                assert len(set(o.gpu_groups)) == pod.request.fraction_devices  # distinct
                node = nodes[o.node]
                cost = pod.request.gpu_fraction_milli or -(-pod.request.gpu_memory_mib * 1000
                                                            // node.gpu_memory_mib)
                for g in o.gpu_groups:
                    groups[(o.node, g)] += cost
    shared_devices = defaultdict(int)
    for (node, _), used in groups.items():
        assert used <= 1000, f"device on {node} over-committed: {used}"
        shared_devices[node] += 1
    for name, node in nodes.items():
        assert cpu[name] <= node.cpu_m, f"{name} CPU over-committed"
        assert gpu[name] + shared_devices[name] <= node.gpus, f"{name} GPUs over-committed"


def _check_gangs(snapshot: Snapshot, result) -> None:
    for job in snapshot.jobs:
        before = sum(1 for p in job.pods if p.status == PodStatus.RUNNING)
        new = sum(1 for p in job.pods if p.status == PodStatus.PENDING
                  and result.pods[p.name].status == "Binding")
        if new:
            assert before + new >= job.min_member, f"{job.name}: partial gang bound"


def _check_limits(snapshot: Snapshot, result) -> None:
    for q in snapshot.queues:
        if q.gpu.limit < 0 or q.parent is None:
            continue
        used = 0.0
        for job in snapshot.jobs:
            if job.queue != q.name:
                continue
            for pod in job.pods:
                if _bound(result.pods[pod.name].status):
                    r = pod.request
                    used += r.gpus + r.gpu_fraction_milli / 1000 * r.fraction_devices
        assert used <= q.gpu.limit + 1e-9, f"queue {q.name} over its GPU limit"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_invariants(cluster):
    nodes, queues, first, later, (placement, policy) = cluster
    config = SchedulerConfig(placement=dataclasses.replace(SchedulerConfig().placement,
                                                           gpu=placement, cpu=placement),
                             gpu_packing=policy)
    snapshot = Snapshot(nodes, queues, tuple(first))
    result = schedule(snapshot, config, 0.0)
    _check_capacity(snapshot, result)
    _check_gangs(snapshot, result)
    _check_limits(snapshot, result)

    # the first decisions carried out, then new work arrives
    snapshot = advance(snapshot, result)
    snapshot = dataclasses.replace(snapshot, jobs=snapshot.jobs + tuple(later))
    result = schedule(snapshot, config, 1.0)
    _check_capacity(snapshot, result)
    _check_gangs(snapshot, result)
    _check_limits(snapshot, result)
    non_preemptible = {j.name for j in snapshot.jobs if not j.is_preemptible}
    for ev in result.evictions:
        if ev.action != "stalegangeviction":
            assert ev.job not in non_preemptible, f"non-preemptible {ev.job} evicted"

    again = schedule(snapshot, config, 1.0)
    assert again.pods == result.pods
    assert again.binds == result.binds and again.evictions == result.evictions
