"""Synthetic clusters for benchmarks: N nodes x 8 GPUs, half full of running pods, with pending
gangs of 1-16 pods (a third of them fractional) adding up to 10 x N pods."""

from __future__ import annotations

import random

from kai_ray.core.model import Job, Node, Pod, PodStatus, Queue, Request, ResourceQuota, Snapshot

GPUS_PER_NODE = 8
OPEN = ResourceQuota(-1.0, -1.0, 1.0)


def cluster(nodes: int, seed: int = 0, pending_per_node: int = 10, queues: int = 4) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(
        Node(name=f"node-{i:05d}", cpu_m=128_000, memory=1024 * 10**9, gpus=GPUS_PER_NODE,
             gpu_memory_mib=81920, max_pods=250)
        for i in range(nodes))
    total_gpus = nodes * GPUS_PER_NODE
    queue_list = [Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN)]
    for q in range(queues):
        queue_list.append(Queue(f"team-{q}", parent="root",
                                gpu=ResourceQuota(total_gpus / queues, -1.0, 1.0),
                                cpu=OPEN, memory=OPEN, created=float(q)))
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
