"""The cluster's nodes for one session (KAI's NodeInfo, one array per number): capacity, what
the pods use, split as KAI splits it into idle and releasing, whole GPUs, and shared GPU
devices (KAI's GPU groups). Arrays are by node index, nodes in name order.

The operations here move one task's resources on or off its node; which ones a decision calls,
and undoing them, is the Statement's (`statement.py`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kai_ray.core.jobs import Task
from kai_ray.core.model import MILLI, Amounts, Node, PodStatus, Request

IntArray = npt.NDArray[np.int64]


class Group:
    """A shared GPU device (KAI GPU group): usage in milli of the device. As KAI counts it
    (gpu_sharing_node_info.go), a pipelined sharer is not charged to the device's idle room
    but to its releasing room: `used` is the active sharers but pipelined ones (releasing
    ones included; KAI's AllocatedSharedGPUsMemory), `releasing` the releasing ones less the
    pipelined ones (KAI's ReleasingSharedGPUsMemory: may be negative), `pipelined` what the
    pipelined ones take. So the room, `MILLI - used + releasing`, counts every sharer once,
    and `used + pipelined` is all of them (KAI's UsedSharedGPUsMemory). `from_idle`: an
    unpipelined sharer opened the device, so KAI took it from the idle GPUs
    (gpu_sharing_node_info.go:120-127) and gives it back only once no sharer at all is left
    (:212-217): pipelined sharers alone then keep it out of idle; one a pipelined sharer
    opened is taken from releasing (:113-119)."""

    __slots__ = ("from_idle", "gid", "pipelined", "releasing", "tasks", "used")

    def __init__(self, gid: str, used: int = 0, releasing: int = 0) -> None:
        self.gid, self.used, self.releasing = gid, used, releasing
        self.pipelined = 0
        self.from_idle = False
        self.tasks: set[int] = set()


class ClusterState:
    """Nodes, their usage and their shared devices."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.name)
        nodes = self.nodes
        self.node_index = {n.name: i for i, n in enumerate(nodes)}
        count = len(nodes)
        self.schedulable = np.array([n.ready and not n.unschedulable for n in nodes], dtype=bool)
        self.cap_cpu = np.array([n.cpu_m - n.foreign_cpu_m for n in nodes], dtype=np.int64)
        self.cap_mem = np.array([n.memory - n.foreign_memory for n in nodes], dtype=np.int64)
        self.cap_gpu = np.array([n.gpus - n.foreign_gpus for n in nodes], dtype=np.int64)
        self.max_pods = np.array([n.max_pods - n.foreign_pods for n in nodes], dtype=np.int64)
        self.gpu_mem = np.array([max(n.gpu_memory_mib, 1) for n in nodes], dtype=np.int64)
        self.gpu_mem_synced = np.array([n.gpu_memory_synced for n in nodes], dtype=bool)
        self.node_labels = [dict(n.labels) for n in nodes]
        self.node_taints = [n.taints for n in nodes]
        self.any_taints = any(self.node_taints)
        # usage as KAI's NodeInfo splits it (addTaskResources): "used" is what idle lacks
        # (cap - used is KAI's Idle): all active pods, releasing ones included, but pipelined
        # ones; "rel" is KAI's Releasing: the releasing pods less the pipelined ones, which
        # wait for them (so it may be negative). cap - used + rel counts every pod once.
        self.used_cpu = np.zeros(count, dtype=np.int64)
        self.rel_cpu = np.zeros(count, dtype=np.int64)
        self.used_mem = np.zeros(count, dtype=np.int64)
        self.rel_mem = np.zeros(count, dtype=np.int64)
        self.used_pods = np.zeros(count, dtype=np.int64)
        # whole-GPU pods' devices, and the releasing part, split as above
        self.whole_used = [0] * count
        self.whole_rel = [0] * count
        self.used_gpu = np.zeros(count, dtype=np.int64)  # whole + one per shared group
        self.rel_gpu = np.zeros(count, dtype=np.int64)
        self.groups: list[dict[str, Group]] = [{} for _ in range(count)]
        # shared devices as arrays (node x slot), mirrored from `groups` for vectorised fits
        width = max(1, int(self.cap_gpu.max()) if count else 1)
        self.dev_used = np.zeros((count, width), dtype=np.int64)
        self.dev_rel = np.zeros((count, width), dtype=np.int64)
        self.dev_on = np.zeros((count, width), dtype=bool)
        # device ids the snapshot's pods name (a new device's id avoids them: `new_group_id`)
        self.known_groups: set[str] = set()
        self.total = [float(self.cap_cpu[self.schedulable].sum()),
                      float(self.cap_mem[self.schedulable].sum()),
                      float(self.cap_gpu[self.schedulable].sum())]

    # ------------------------------------------------------------------ amounts
    def device_cost(self, req: Request, node: int) -> int:
        """Milli of one device a shared request takes on this node."""
        if req.gpu_fraction_milli:
            return req.gpu_fraction_milli
        return math.ceil(req.gpu_memory_mib * MILLI / int(self.gpu_mem[node]))

    def portion(self, req: Request, node: int) -> float:
        """GPU portion recorded for a shared pod on this node (gpu-memory rounds up to 1/100)."""
        if req.gpu_fraction_milli:
            return req.gpu_fraction_milli / MILLI
        return math.ceil(req.gpu_memory_mib / int(self.gpu_mem[node]) * 100) / 100

    def queue_amount(self, task: Task) -> Amounts:
        """What a placed task is charged to its queue (a gpu-memory pod's share of a GPU
        depends on its node's device memory)."""
        req = task.req
        if req.gpus:
            gpu = float(req.gpus)
        elif req.is_shared and task.node >= 0:
            gpu = self.portion(req, task.node) * req.fraction_devices
        else:
            gpu = 0.0
        return (float(req.cpu_m), float(req.memory), gpu)

    def widest_gpu_node(self) -> int:
        """The node whose GPUs have the most memory (the first of them), 0 when none."""
        return int(np.argmax(self.gpu_mem)) if len(self.nodes) else 0

    def free_cpu(self) -> IntArray:
        return self.cap_cpu - self.used_cpu + self.rel_cpu

    def free_gpu(self) -> IntArray:
        return self.cap_gpu - self.used_gpu + self.rel_gpu

    def new_group_id(self, node: int, besides: Sequence[str] = ()) -> str:
        """A shared-device id that no pod in the snapshot and no device on the node uses:
        the first free number on the node, so it depends on the state alone (not on attempts
        rolled back before, which a running counter would), unlike KAI's UUIDs. `besides`: ids
        already picked for the same pod."""
        k = 0
        while True:
            k += 1
            gid = f"{self.nodes[node].name}-gpu-{k}"
            if (gid not in self.known_groups and gid not in self.groups[node]
                    and gid not in besides):
                return gid

    # ------------------------------------------------------------------ a task on its node
    def refresh_gpu(self, node: int, devices: bool = True) -> None:
        """Recount the node's GPUs and mirror its shared devices into the device arrays
        (`devices` false: they did not change, a whole-GPU pod came or went)."""
        groups = self.groups[node]
        used = self.whole_used[node]
        rel = self.whole_rel[node]
        # a device some unpipelined sharer holds is not idle; one all of whose sharers are
        # releasing is releasing; one only pipelined sharers hold is taken from releasing
        # (KAI: a sharer pipelined onto an empty or all-releasing device takes one releasing
        # GPU, and leaves the idle ones alone), unless an unpipelined sharer opened it (a job
        # allocate pipelines whole once one of its pods is: Group.from_idle)
        for g in groups.values():
            if g.used > 0 or g.from_idle:
                used += 1
                if g.used == g.releasing:
                    rel += 1
            else:
                rel -= 1
        self.used_gpu[node] = used
        self.rel_gpu[node] = rel
        if not devices:
            return
        count = len(groups)
        if count > self.dev_used.shape[1]:
            self._grow_devices(count)
        pad = [0] * (self.dev_used.shape[1] - count)
        self.dev_on[node] = [True] * count + [False] * len(pad)
        self.dev_used[node] = [g.used for g in groups.values()] + pad
        self.dev_rel[node] = [g.releasing for g in groups.values()] + pad

    def _grow_devices(self, width: int) -> None:
        pad = width - self.dev_used.shape[1]
        count = self.dev_used.shape[0]
        self.dev_used = np.hstack([self.dev_used, np.zeros((count, pad), dtype=np.int64)])
        self.dev_rel = np.hstack([self.dev_rel, np.zeros((count, pad), dtype=np.int64)])
        self.dev_on = np.hstack([self.dev_on, np.zeros((count, pad), dtype=bool)])

    def add_usage(self, node: int, cpu: int, memory: int, pods: int) -> None:
        self.used_cpu[node] += cpu
        self.used_mem[node] += memory
        self.used_pods[node] += pods

    def place(self, task: Task, node: int, groups: tuple[str, ...],
              pipelined: bool = False) -> None:
        """The task's resources onto `node` (devices `groups` for a shared request)."""
        req = task.req
        self.add_usage(node, req.cpu_m, req.memory, 1)
        self.hold_gpus(task, node, groups, pipelined)
        if pipelined:
            self.pipeline_charge(task, +1, refresh=False)
        if req.wants_gpu:
            self.refresh_gpu(node, devices=not req.gpus)

    def hold_gpus(self, task: Task, node: int, groups: tuple[str, ...],
                  pipelined: bool) -> None:
        """The task on `node`: its whole GPUs or its share of devices `groups`, and what it is
        charged (the node's GPU counts are left to `refresh_gpu`)."""
        req = task.req
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] + req.gpus
        elif req.is_shared:
            cost = self.device_cost(req, node)
            task.gpu_mem_cost = cost
            for gid in groups:
                group = self.groups[node].get(gid)
                if group is None:
                    group = Group(gid)
                    group.from_idle = not pipelined
                    self.groups[node][gid] = group
                group.used += cost
                group.tasks.add(task.idx)
        task.node = node
        task.groups = groups
        task.accepted_gpu = self.queue_amount(task)[2]

    def remove(self, task: Task) -> None:
        """The task's resources off its node (it has none after)."""
        if task.status == PodStatus.PIPELINED:
            self.pipeline_charge(task, -1, refresh=False)
        node, req = task.node, task.req
        self.add_usage(node, -req.cpu_m, -req.memory, -1)
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] - req.gpus
        elif req.is_shared:
            for gid in task.groups:
                group = self.groups[node][gid]
                group.used -= task.gpu_mem_cost
                group.tasks.discard(task.idx)
                if not group.tasks:
                    del self.groups[node][gid]
        if req.wants_gpu:
            self.refresh_gpu(node, devices=not req.gpus)
        task.node = -1
        task.groups = ()

    def mark_releasing(self, task: Task, sign: int) -> None:
        """The task's resources become releasing (sign +1) or stop being so (-1)."""
        node, req = task.node, task.req
        if node < 0:
            return  # a pod on a node the snapshot does not have: nothing of ours to release
        self.rel_cpu[node] += sign * req.cpu_m
        self.rel_mem[node] += sign * req.memory
        if req.gpus:
            self.whole_rel[node] = self.whole_rel[node] + sign * req.gpus
        elif req.is_shared:
            for gid in task.groups:
                self.groups[node][gid].releasing += sign * task.gpu_mem_cost
        if req.wants_gpu:
            self.refresh_gpu(node, devices=not req.gpus)

    def pipeline_charge(self, task: Task, sign: int, refresh: bool = True) -> None:
        """A placed task becomes pipelined (sign +1) or stops being so (-1). KAI charges a
        Pipelined pod to the node's releasing resources and leaves its idle ones alone
        (NodeInfo.addTaskResources: Releasing -= request, Idle unchanged): the task's amounts
        leave `used` and `rel` both (see `__init__`), so the room with releasing stays."""
        node, req = task.node, task.req
        if node < 0:
            return
        cpu, memory = sign * req.cpu_m, sign * req.memory
        self.add_usage(node, -cpu, -memory, 0)
        self.rel_cpu[node] -= cpu
        self.rel_mem[node] -= memory
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] - sign * req.gpus
            self.whole_rel[node] = self.whole_rel[node] - sign * req.gpus
        elif req.is_shared:
            cost = sign * task.gpu_mem_cost
            for gid in task.groups:
                group = self.groups[node][gid]
                group.used -= cost
                group.releasing -= cost
                group.pipelined += cost
                if len(group.tasks) == 1:
                    # KAI moves a pod between Allocated and Pipelined by removing and adding
                    # it: its device alone, it empties and the pod opens it again
                    group.from_idle = sign < 0
        if refresh and req.wants_gpu:
            self.refresh_gpu(node, devices=not req.gpus)

    def set_charge(self, task: Task, old: PodStatus, new: PodStatus) -> None:
        """The node charge of a task whose status goes from `old` to `new` (both placed)."""
        if old == PodStatus.PIPELINED and new != PodStatus.PIPELINED:
            self.pipeline_charge(task, -1)
        elif new == PodStatus.PIPELINED and old != PodStatus.PIPELINED:
            self.pipeline_charge(task, +1)
