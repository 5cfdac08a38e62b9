"""Choosing a node (and GPU devices) for one task: predicates and scores, vectorised over nodes.

Scores follow KAI's plugins: gpusharingorder +1000 when an already-shared device of
the node fits, nodeavailability +100 when the task fits without waiting for releasing resources,
resourcetype +10 for a CPU-only task on a CPU-only node, and nodeplacement 0..9 (binpack: fewer
free units scores higher, normalised over all candidate nodes; spread: free/total). Ties go to the
node that sorts first by name (nodes are indexed in name order).

This is the specification: every choice is one pass over every node, as arrays. The Rust core
takes the same decisions with shortcuts (a few candidate nodes from its GPU room index, binpack
walks, the carry-over); tests/core/test_native_core.py compares the two.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kai_ray.core import packing_policy
from kai_ray.core.cluster import Group
from kai_ray.core.constraints import affinity_matches, untolerated
from kai_ray.core.jobs import Task
from kai_ray.core.model import MILLI, Request
from kai_ray.core.scratch import Key
from kai_ray.core.state import Session

BoolArray = npt.NDArray[np.bool_]

# predicate names as KAI words them in "N node(s) didn't have enough resources: X"
R_GPU = "didn't have enough resources: GPUs"
R_GPU_MEM = "didn't have enough resources: GPU memory"
R_CPU = "didn't have enough resources: CPU cores"
R_MEM = "didn't have enough resources: memory"
R_PODS = "pod number exceeded"
R_UNSCHED = "were unschedulable"
R_SELECTOR = "didn't match Pod's node affinity/selector"
# per node selector and affinity, per tolerations: which nodes (fixed for a session)
SELECTOR_MASKS: Key[dict[object, BoolArray]] = Key("selector masks")
TAINT_MASKS: Key[dict[object, tuple[BoolArray | None, list[tuple[BoolArray, str]]]]] = Key(
    "taint masks")


class Choice:
    """Where a task goes (one per placement, simulations included)."""

    __slots__ = ("groups", "new_groups", "node", "on_idle")

    def __init__(self, node: int, groups: tuple[str, ...], new_groups: tuple[str, ...],
                 on_idle: bool) -> None:
        self.node, self.groups, self.new_groups, self.on_idle = node, groups, new_groups, on_idle


def _selector_mask(sess: Session, task: Task) -> BoolArray | None:
    """Nodes matching the task's node selector and required node affinity (None: all)."""
    selector, affinity = task.pod.node_selector, task.pod.node_affinity
    if not selector and affinity is None:
        return None
    key = (selector, affinity)
    cache = sess.scratch.setdefault(SELECTOR_MASKS, dict)
    mask = cache.get(key)
    if mask is None:
        names = [n.name for n in sess.cluster.nodes]
        mask = np.array([all(labels.get(k) == v for k, v in selector)
                         and (affinity is None or affinity_matches(affinity, name, labels))
                         for name, labels in zip(names, sess.cluster.node_labels, strict=True)],
                        dtype=bool)
        cache[key] = mask
    return mask


def _taint_masks(sess: Session, task: Task) -> tuple[BoolArray | None, list[tuple[BoolArray, str]]]:
    """Nodes whose taints the task tolerates (None: all), and per untolerated taint the mask of
    the nodes it does not keep the task off, with Kubernetes' wording."""
    if not sess.cluster.any_taints:
        return None, []
    cache = sess.scratch.setdefault(TAINT_MASKS, dict)
    known = cache.get(task.pod.tolerations)
    if known is None:
        first = [untolerated(taints, task.pod.tolerations) for taints in sess.cluster.node_taints]
        blocked = np.array([t is not None for t in first], dtype=bool)
        per_taint = [(np.array([t != taint for t in first], dtype=bool),
                      f"had untolerated taint {{{taint.key}: {taint.value}}}")
                     for taint in dict.fromkeys(t for t in first if t is not None)]
        known = cache[task.pod.tolerations] = (~blocked if blocked.any() else None, per_taint)
    return known


def _device_order(sess: Session) -> str:
    cfg = sess.config
    if cfg.gpu_device_order:
        return cfg.gpu_device_order
    return "gpuspread" if cfg.placement.gpu == "spread" else "gpupack"


def _shared_candidates(sess: Session, task: Task, node: int) -> tuple[list[Group], int, int]:
    """Existing groups the task fits on (idle or releasing) and the node's idle / releasing
    whole devices that could become new shared devices."""
    cluster = sess.cluster
    cost = cluster.device_cost(task.req, node)
    fitting = [g for g in cluster.groups[node].values()
               if MILLI - g.used + g.releasing - cost >= 0 and g.releasing < g.used]
    idle_whole = int(cluster.cap_gpu[node] - cluster.used_gpu[node])
    rel_whole = int(cluster.rel_gpu[node])
    return fitting, idle_whole, rel_whole


def _predicates(sess: Session, task: Task) -> tuple[list[tuple[BoolArray, str]], BoolArray]:
    """Each predicate as (mask of nodes that pass, KAI's reason), and the fits-on-idle mask."""
    cluster = sess.cluster
    req = task.req
    preds: list[tuple[BoolArray, str]] = list(_taint_masks(sess, task)[1])
    sel = _selector_mask(sess, task)
    if sel is not None:
        preds.append((sel, R_SELECTOR))
    idle_ok = np.ones(len(cluster.nodes), dtype=bool)
    if req.cpu_m:
        idle_cpu = cluster.cap_cpu - cluster.used_cpu
        preds.append((idle_cpu + cluster.rel_cpu >= req.cpu_m, R_CPU))
        idle_ok &= idle_cpu >= req.cpu_m
    if req.memory:
        idle_mem = cluster.cap_mem - cluster.used_mem
        preds.append((idle_mem + cluster.rel_mem >= req.memory, R_MEM))
        idle_ok &= idle_mem >= req.memory
    if req.gpus:
        idle_gpu = cluster.cap_gpu - cluster.used_gpu
        preds.append((idle_gpu + cluster.rel_gpu >= req.gpus, R_GPU))
        idle_ok &= idle_gpu >= req.gpus
    preds.append((cluster.used_pods + _pod_slots(req) <= cluster.max_pods, R_PODS))
    if req.is_shared:
        if req.gpu_memory_mib:
            synced_and_wide = cluster.gpu_mem_synced & (cluster.gpu_mem >= req.gpu_memory_mib)
            preds.append((synced_and_wide, R_GPU_MEM))
        cost = _cost_vector(sess, task)[:, None]
        live = cluster.dev_on & (cluster.dev_rel < cluster.dev_used)  # not entirely releasing
        fit = live & (MILLI - cluster.dev_used + cluster.dev_rel - cost >= 0)
        fit_groups = fit.sum(axis=1)
        # on idle: of those, the devices some unpipelined sharer holds with idle room (KAI's
        # EnoughIdleResourcesOnGpu, asked of fitting devices only: with pipelined sharers,
        # charged to releasing, the idle room may be more than the room)
        idle_room = (cluster.dev_used > 0) & (MILLI - cluster.dev_used - cost >= 0)
        idle_groups = (fit & idle_room).sum(axis=1)
        idle_whole = cluster.cap_gpu - cluster.used_gpu
        rel_whole = cluster.rel_gpu
        preds.append((fit_groups + idle_whole + rel_whole >= req.fraction_devices, R_GPU))
        idle_ok &= idle_groups + idle_whole >= req.fraction_devices
    return preds, idle_ok


def _pod_slots(req: Request) -> int:
    """Pod slots a task needs on a node: a GPU-sharing pod also keeps one for a potential
    reservation pod, whether or not it joins a device that has one (KAI's NodePodNumber)."""
    return 2 if req.is_shared else 1


def feasible(sess: Session, task: Task, explain: bool = False
             ) -> tuple[BoolArray, BoolArray, dict[str, int]]:
    """(fits with releasing, fits on idle, failed-predicate histogram) over all nodes. The
    histogram (first failing predicate per node) is only built when `explain` is set."""
    preds, idle_ok = _predicates(sess, task)
    ok = sess.cluster.schedulable.copy()
    reasons: dict[str, int] = {}
    if explain:
        reasons[R_UNSCHED] = int((~ok).sum())
    for mask, reason in preds:
        if explain:
            failed = int((ok & ~mask).sum())
            if failed:
                reasons[reason] = reasons.get(reason, 0) + failed
        ok &= mask
    return ok, ok & idle_ok, {k: v for k, v in reasons.items() if v}


def _available(sess: Session, task: Task) -> BoolArray:
    """Over all nodes, KAI's nodeavailability score (+100, IsTaskAllocatable) for a shared-GPU
    task: its CPU and memory fit on idle resources and, per device it asks, there is an idle
    whole GPU or a shared device it fits on with the releasing room counted
    (fractionTaskGpusAllocatableDeviceCount, node_info.go:327-348). Placing it on idle
    resources (bound, not pipelined) counts only a device's idle room."""
    cluster = sess.cluster
    req = task.req
    ok = ((cluster.cap_cpu - cluster.used_cpu >= req.cpu_m)
          & (cluster.cap_mem - cluster.used_mem >= req.memory))
    cost = _cost_vector(sess, task)[:, None]
    live = cluster.dev_on & (cluster.dev_rel < cluster.dev_used)
    fit = live & (MILLI - cluster.dev_used + cluster.dev_rel - cost >= 0)
    available: BoolArray = ok & (fit.sum(axis=1) + cluster.cap_gpu - cluster.used_gpu
                                 >= req.fraction_devices)
    return available


def scores(sess: Session, task: Task, fits: BoolArray, fits_idle: BoolArray,
           within: BoolArray | None = None) -> npt.NDArray[np.float64]:
    """KAI's node order scores; binpack normalises free amounts over the nodes `within`
    (default: every schedulable node)."""
    cluster = sess.cluster
    req = task.req
    cfg = sess.config.placement
    if req.wants_gpu:
        free = cluster.free_gpu().astype(np.float64)
        total = cluster.cap_gpu.astype(np.float64)
        strategy = cfg.gpu
    else:
        free = cluster.free_cpu().astype(np.float64)
        total = cluster.cap_cpu.astype(np.float64)
        strategy = cfg.cpu
    has = total > 0
    if strategy == "spread":
        base = np.where(has, free / np.where(has, total, 1.0), 0.0)
    else:
        cand = cluster.schedulable & has
        if within is not None:
            cand &= within
        if cand.any():
            lo, hi = free[cand].min(), free[cand].max()
            base = np.full(len(free), 9.0) if hi == lo else 9.0 * (1.0 - (free - lo) / (hi - lo))
        else:
            base = np.zeros(len(free))
        base = np.where(has, base, 0.0)
    if req.is_shared:
        fits_idle = fits & _available(sess, task)  # KAI's availability score (`_available`)
    score = base + np.where(fits_idle, 100.0, 0.0)
    if not req.wants_gpu:
        score += np.where(cluster.cap_gpu == 0, 10.0, 0.0)
    if cfg.gpu != "spread" and not req.gpus:
        score += 1000.0 * _sharing_bonus(sess, task, fits)
    return score


def _cost_vector(sess: Session, task: Task) -> npt.NDArray[np.int64]:
    """Milli of a device the task takes on each node (gpu-memory depends on the node)."""
    cluster = sess.cluster
    req = task.req
    if req.gpu_fraction_milli:
        return np.full(len(cluster.nodes), req.gpu_fraction_milli, dtype=np.int64)
    if req.gpu_memory_mib:
        return -((-req.gpu_memory_mib * MILLI) // cluster.gpu_mem)
    return np.zeros(len(cluster.nodes), dtype=np.int64)


def _sharing_bonus(sess: Session, task: Task, fits: BoolArray) -> npt.NDArray[np.float64]:
    """1 where a shared device of the node can take the task (gpusharingorder; KAI's
    IsTaskFitOnGpuGroup: a device some sharer still holds, not all of it releasing, with room
    for the task, releasing room counted; a full device qualifies for a CPU-only pod, whose
    cost is 0: KAI scores those nodes too)."""
    cluster = sess.cluster
    cost = _cost_vector(sess, task)[:, None]
    joinable = (cluster.dev_on & (cluster.dev_rel < cluster.dev_used)
                & (MILLI - cluster.dev_used + cluster.dev_rel - cost >= 0))
    return (joinable.any(axis=1) & fits).astype(np.float64)


def choose_devices(sess: Session, task: Task, node: int) -> tuple[tuple[str, ...],
                                                                   tuple[str, ...], bool]:
    """Shared devices for a fractional task on `node`: (groups, new groups, all on idle)."""
    req = task.req
    cost = sess.cluster.device_cost(req, node)
    fitting, idle_whole, rel_whole = _shared_candidates(sess, task, node)
    pack = _device_order(sess) != "gpuspread"
    cands: list[tuple[float, int, str | None, bool]] = []
    for order, g in enumerate(sorted(fitting, key=lambda g: g.gid)):
        used = (g.used + g.pipelined) / MILLI  # every sharer (KAI's GetUsedGpuPortion)
        score = used if pack else 1.0 - used
        cands.append((score, order, g.gid, g.used > 0 and MILLI - g.used - cost >= 0))
    base = len(cands)
    for i in range(idle_whole + rel_whole):
        cands.append((0.0 if pack else 1.0, base + i, None, i < idle_whole))
    cands.sort(key=lambda c: (-c[0], c[1]))
    chosen = cands[: req.fraction_devices]
    groups: list[str] = []
    new: list[str] = []
    on_idle = True
    for _, _, gid, idle in chosen:
        on_idle = on_idle and idle
        if gid is None:
            gid = sess.cluster.new_group_id(node, new)
            new.append(gid)
        groups.append(gid)
    return tuple(groups), tuple(new), on_idle


def choose(sess: Session, task: Task, explain: bool = True
           ) -> tuple[Choice | None, dict[str, int]]:
    """Best node for `task`, or None with the failed-predicate histogram (empty unless
    `explain`: simulations do not need it). A virtually evicted victim is placed like any task;
    if that lands it where it was, the session un-evicts it. Under a node filter (a victim
    scenario's nodes, `Session.node_filter`) only those nodes are candidates, and binpack
    scores are normalised over them (KAI's AllocateJob is handed that node list)."""
    within: BoolArray | None = None
    if sess.node_filter is not None:
        within = np.zeros(len(sess.cluster.nodes), dtype=bool)
        within[sess.node_filter] = True
    fits, fits_idle, _ = feasible(sess, task)
    if within is not None:
        fits &= within
        fits_idle &= within
    if not fits.any():
        # the histogram is over every node, a scenario's included
        return None, feasible(sess, task, explain=True)[2] if explain else {}
    if sess.config.gpu_packing != "kai" and task.req.wants_gpu:
        picked = packing_policy.choose(sess, task, fits_idle)
        if picked is not None:
            return Choice(picked[0], picked[1], picked[2], True), {}
    score = scores(sess, task, fits, fits_idle, within)
    node = int(np.argmax(np.where(fits, score, -np.inf)))
    return place_on(sess, task, node, bool(fits_idle[node])), {}


def place_on(sess: Session, task: Task, node: int, on_idle: bool) -> Choice:
    if task.req.is_shared:
        groups, new, devices_idle = choose_devices(sess, task, node)
        return Choice(node, groups, new, devices_idle and on_idle)
    return Choice(node, (), (), on_idle)
