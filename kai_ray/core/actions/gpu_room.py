"""KAI's accumulated idle-GPU filter, made device-aware (`GpuRoom`): would the GPUs free now,
plus what a scenario's victims free, take a prefix's GPU requests? A scenario that fails it is
not simulated: no placement could succeed."""

from __future__ import annotations

import numpy as np

from kai_ray.core.cluster import Group
from kai_ray.core.jobs import Task
from kai_ray.core.model import MILLI
from kai_ray.core.state import Session

# free whole GPUs per node, room per shared device (node, device id)
Whole = dict[int, int]
Rooms = dict[tuple[int, str], int]


def freed_whole(group: Group, amount: int) -> bool:
    """Whether victims freeing `amount` of a shared device make it a whole GPU for KAI's
    idle-GPU filter. A device only pipelined sharers hold KAI counts in neither of a node's sums
    (GetSumOfIdleGPUs, GetSumOfReleasingGPUs: gpu_sharing_node_info.go:303-325), and its victims
    add only their own fractions (idle_gpus.go:209): whole once those make a device."""
    if group.used <= 0:
        return amount >= MILLI
    return amount + group.releasing >= group.used


def free_gpus(sess: Session) -> tuple[Whole, Rooms]:
    """What is free now: whole GPUs per schedulable node that has some (idle or releasing),
    and room per shared device that has some and that not all its sharers are leaving."""
    cluster = sess.cluster
    free = np.where(cluster.schedulable, cluster.free_gpu(), 0)
    nodes = np.flatnonzero(free > 0).tolist()
    whole = dict(zip(nodes, free[nodes].tolist(), strict=True))
    rooms: Rooms = {}
    for node in np.flatnonzero(cluster.schedulable).tolist():
        for gid, g in cluster.groups[node].items():
            room = MILLI - g.used + g.releasing
            if g.releasing < g.used and room > 0:
                rooms[(node, gid)] = room
    return whole, rooms


def needs(sess: Session, prefix: list[Task]) -> tuple[list[int], list[int]]:
    """The prefix's whole-GPU requests and its fractions in milli of a device, largest first
    (a fraction at its cheapest: gpu-memory costs least on the biggest GPUs)."""
    whole = sorted((t.req.gpus for t in prefix if t.req.gpus), reverse=True)
    widest = sess.cluster.widest_gpu_node()
    fractions = sorted((sess.cluster.device_cost(t.req, widest) for t in prefix
                        for _ in range(t.req.fraction_devices) if t.req.is_shared),
                       reverse=True)
    return whole, fractions


class GpuRoom:
    """The filter for one prefix over the GPUs free when it started (`free`): whole-GPU
    requests need whole devices (a shared device frees up only when all its sharers go),
    fractional requests one device with enough room each; matched greedily, the largest
    request into the roomiest place. Victims are counted as they are added (`add_victim`),
    or for one scenario alone (`enough_with`)."""

    def __init__(self, sess: Session, free: tuple[Whole, Rooms], prefix: list[Task]) -> None:
        self.sess = sess
        self.base_whole, self.base_rooms = free
        self.whole_needed, self.fractions_needed = needs(sess, prefix)
        self.trivial = not self.whole_needed and not self.fractions_needed
        # the victims added so far, as overlays over `free`: whole GPUs of the nodes and rooms
        # of the devices they changed (room 0: the device freed up whole), and what they free
        # per device
        self.whole: Whole = {}
        self.rooms: Rooms = {}
        self.freed: Rooms = {}

    def add_victim(self, task: Task) -> None:
        if not self.trivial:
            self._free_into(task, self.whole, self.rooms, self.freed)

    def enough(self) -> bool:
        """Whether the victims added so far make enough room."""
        return self.trivial or self._match(self.whole, self.rooms)

    def enough_with(self, victims: list[Task]) -> bool:
        """The same when only `victims` go (one scenario)."""
        if self.trivial:
            return True
        whole: Whole = {}
        rooms: Rooms = {}
        freed: Rooms = {}
        for t in victims:
            self._free_into(t, whole, rooms, freed)
        return self._match(whole, rooms)

    def _free_into(self, t: Task, whole: Whole, rooms: Rooms, freed: Rooms) -> None:
        """Count victim `t` as gone: its whole GPUs, or its share of each of its devices (a
        device all of whose sharers go becomes a whole GPU, once: its room is set to 0)."""
        sess = self.sess
        if t.node < 0 or not sess.cluster.schedulable[t.node]:
            return
        if t.req.gpus:
            whole[t.node] = whole.get(t.node, self.base_whole.get(t.node, 0)) + t.req.gpus
            return
        for gid in t.groups:
            key = (t.node, gid)
            before = freed.get(key, 0)
            freed[key] = before + t.gpu_mem_cost
            group = sess.cluster.groups[t.node].get(gid)
            if group is None or freed_whole(group, before):
                # a device freed whole already (more pipelined sharers than it holds): it
                # gives no second GPU
                continue
            if freed_whole(group, freed[key]):
                whole[t.node] = whole.get(t.node, self.base_whole.get(t.node, 0)) + 1
                rooms[key] = 0
            else:
                rooms[key] = MILLI - group.used + group.releasing + freed[key]

    def _match(self, whole: Whole, rooms: Rooms) -> bool:
        """Whole requests into nodes' free whole GPUs, then fractions into device rooms and
        the whole GPUs left over, each the largest first into the roomiest place."""
        places = {**self.base_whole, **whole}
        if not _largest_first(list(places.values()), self.whole_needed):
            return False
        if not self.fractions_needed:
            return True
        spare = sum(places.values()) - sum(self.whole_needed)
        device_rooms = list({**self.base_rooms, **rooms}.values())
        return _largest_first(device_rooms + [MILLI] * min(len(self.fractions_needed), spare),
                              self.fractions_needed)


def _largest_first(places: list[int], needs: list[int]) -> bool:
    """Whether `needs` (largest first) each fit into the roomiest of `places` left."""
    # a scan for the roomiest place per need (ties: any, only the amounts matter)
    rooms = [v for v in places if v > 0]
    for need in needs:
        at, most = -1, 0
        for i in range(len(rooms)):
            if rooms[i] > most:
                at, most = i, rooms[i]
        if most < need:
            return False
        if at < 0:
            rooms.append(most - need)
        else:
            rooms[at] = most - need
    return True
