"""Synthetic clusters for benchmarks, N nodes x 8 GPUs each.

`cluster`: the issue's workload, half full of running pods, with pending gangs of 1-16 pods (a
third of them fractional) adding up to 10 x N pods. `busy_cluster`: a cluster that is mostly
running with little pending, shaped like the production snapshot of KAI-Scheduler#315."""

from __future__ import annotations

import random

from kai_ray.core.model import Job, Node, Pod, PodStatus, Queue, Request, ResourceQuota, Snapshot

GPUS_PER_NODE = 8
OPEN = ResourceQuota(-1.0, -1.0, 1.0)


def _nodes(count: int) -> tuple[Node, ...]:
    return tuple(Node(name=f"node-{i:05d}", cpu_m=128_000, memory=1024 * 10**9,
                      gpus=GPUS_PER_NODE, gpu_memory_mib=81920, max_pods=250)
                 for i in range(count))


def _queues(count: int, total_gpus: int) -> list[Queue]:
    """A root and `count` leaf queues, each with an equal share of the GPUs as quota."""
    return [Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN)] + [
        Queue(f"team-{q}", parent="root", gpu=ResourceQuota(total_gpus / count, -1.0, 1.0),
              cpu=OPEN, memory=OPEN, created=float(q))
        for q in range(count)]


def cluster(nodes: int, seed: int = 0, pending_per_node: int = 10, queues: int = 4) -> Snapshot:
    rng = random.Random(seed)
    node_list = _nodes(nodes)
    queue_list = _queues(queues, nodes * GPUS_PER_NODE)
    jobs: list[Job] = []
    # half full: running single-GPU and fractional pods, placed node by node
    for n in range(nodes):
        node = node_list[n].name
        for g in range(GPUS_PER_NODE // 2):
            if g % 3 == 2:
                pods = tuple(
                    Pod(f"run-{n}-{g}-{k}", Request(cpu_m=2000, memory=8 * 10**9,
                                                    gpu_fraction_milli=500),
                        status=PodStatus.RUNNING, node=node, gpu_groups=(f"{node}-dev{g}",))
                    for k in range(2))
            else:
                pods = (Pod(f"run-{n}-{g}", Request(cpu_m=4000, memory=16 * 10**9, gpus=1),
                            status=PodStatus.RUNNING, node=node),)
            for pod in pods:
                jobs.append(Job(name=f"pg-{pod.name}", queue=f"team-{rng.randrange(queues)}",
                                priority=50, pods=(pod,), created=-1.0))
    pending = 0
    j = 0
    while pending < pending_per_node * nodes:
        size = rng.randint(1, 16)
        fractional = rng.random() < 1 / 3
        if fractional:
            req = Request(cpu_m=2000, memory=8 * 10**9,
                          gpu_fraction_milli=rng.choice([250, 500, 750]))
        else:
            req = Request(cpu_m=4000, memory=16 * 10**9, gpus=rng.choice([1, 1, 1, 2, 4, 8]))
        pods = tuple(Pod(f"job-{j}-{k}", req, created=float(j)) for k in range(size))
        jobs.append(Job(name=f"job-{j}", queue=f"team-{rng.randrange(queues)}",
                        priority=rng.choice([50, 50, 75, 100]), pods=pods,
                        min_member=size, created=float(j)))
        pending += size
        j += 1
    return Snapshot(nodes=node_list, queues=tuple(queue_list), jobs=tuple(jobs))


def busy_cluster(nodes: int, seed: int = 0, cpu_pods_per_node: int = 20) -> Snapshot:
    """6 of every node's 8 GPUs busy (five single-GPU pods and a device shared by two half-GPU
    pods) plus `cpu_pods_per_node` CPU-only pods, 27 pods per node (#315: 140,000 pods on 4,000
    nodes). The nodes' pods belong to four queues of equal quota in shares 40/30/20/10 %,
    so team-0 and team-1 run over quota. Pending, as in #315's cases (Deployments of 4-GPU pods,
    one PodGroup per pod): 20 such pods of the under-quota team-3 and 6 of priority 100 in
    team-0 (no node has 4 idle GPUs: they need victims), and 16 half-GPU pods in team-2 (they
    fit on idle GPUs)."""
    rng = random.Random(seed)
    node_list = _nodes(nodes)
    queue_list = _queues(4, nodes * GPUS_PER_NODE)
    jobs: list[Job] = []
    for n, node_spec in enumerate(node_list):
        node = node_spec.name
        share = rng.random()
        queue = "team-0" if share < 0.4 else "team-1" if share < 0.7 else (
            "team-2" if share < 0.9 else "team-3")
        pods = [Pod(f"run-{n}-{g}", Request(cpu_m=4000, memory=16 * 10**9, gpus=1),
                    status=PodStatus.RUNNING, node=node) for g in range(5)]
        pods += [Pod(f"run-{n}-5-{k}", Request(cpu_m=2000, memory=8 * 10**9,
                                               gpu_fraction_milli=500),
                     status=PodStatus.RUNNING, node=node, gpu_groups=(f"{node}-dev5",))
                 for k in range(2)]
        pods += [Pod(f"cpu-{n}-{c}", Request(cpu_m=1000, memory=2 * 10**9),
                     status=PodStatus.RUNNING, node=node) for c in range(cpu_pods_per_node)]
        for pod in pods:
            jobs.append(Job(name=f"pg-{pod.name}", queue=queue, priority=50, pods=(pod,),
                            created=-1.0))
    pending = (("reclaimer", "team-3", 20, Request(cpu_m=8000, memory=32 * 10**9, gpus=4), 50),
               ("preemptor", "team-0", 6, Request(cpu_m=8000, memory=32 * 10**9, gpus=4), 100),
               ("halves", "team-2", 16, Request(cpu_m=2000, memory=8 * 10**9,
                                                gpu_fraction_milli=500), 50))
    for j, (name, queue, size, req, priority) in enumerate(pending):
        for k in range(size):  # a Deployment's pods: one PodGroup each
            jobs.append(Job(name=f"{name}-{k}", queue=queue, priority=priority,
                            pods=(Pod(f"{name}-{k}", req, created=float(j)),),
                            created=float(j)))
    return Snapshot(nodes=node_list, queues=tuple(queue_list), jobs=tuple(jobs))
