"""Choosing a node (and GPU devices) for one task: predicates and scores, vectorised over nodes.

Scores follow KAI's plugins (kai-spec §7): gpusharingorder +1000 when an already-shared device of
the node fits, nodeavailability +100 when the task fits without waiting for releasing resources,
resourcetype +10 for a CPU-only task on a CPU-only node, and nodeplacement 0..9 (binpack: fewer
free units scores higher, normalised over all candidate nodes; spread: free/total). Ties go to the
node that sorts first by name (nodes are indexed in name order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.core.state import MILLI, Group, Session, Task

BoolArray = npt.NDArray[np.bool_]

# predicate names as KAI words them in "N node(s) didn't have enough resources: X"
R_GPU = "didn't have enough resources: GPUs"
R_GPU_MEM = "didn't have enough resources: GPU memory"
R_CPU = "didn't have enough resources: CPU cores"
R_MEM = "didn't have enough resources: memory"
R_PODS = "pod number exceeded"
R_UNSCHED = "were unschedulable"
R_SELECTOR = "didn't match Pod's node affinity/selector"


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    groups: tuple[str, ...]
    new_groups: tuple[str, ...]
    on_idle: bool


def _selector_mask(sess: Session, task: Task) -> BoolArray | None:
    if not task.node_selector:
        return None
    return np.array([all(labels.get(k) == v for k, v in task.node_selector)
                     for labels in sess.node_labels], dtype=bool)


def _device_order(sess: Session) -> str:
    cfg = sess.config
    if cfg.gpu_device_order:
        return cfg.gpu_device_order
    return "gpuspread" if cfg.placement.gpu == "spread" else "gpupack"


def _shared_candidates(sess: Session, task: Task, node: int) -> tuple[list[Group], int, int]:
    """Existing groups the task fits on (idle or releasing) and the node's idle / releasing
    whole devices that could become new shared devices."""
    cost = sess.device_cost(task.req, node)
    fitting = [g for g in sess.groups[node].values()
               if MILLI - g.used + g.releasing - cost >= 0 and g.releasing < g.used]
    idle_whole = int(sess.cap_gpu[node] - sess.used_gpu[node])
    rel_whole = int(sess.rel_gpu[node])
    return fitting, idle_whole, rel_whole


def feasible(sess: Session, task: Task, extra: BoolArray | None = None
             ) -> tuple[BoolArray, BoolArray, dict[str, int]]:
    """(fits with releasing, fits on idle, failed-predicate histogram) over all nodes."""
    req = task.req
    reasons: dict[str, int] = {}
    ok = sess.schedulable.copy()
    reasons[R_UNSCHED] = int((~ok).sum())

    def apply(mask: BoolArray, reason: str) -> None:
        nonlocal ok
        failed = ok & ~mask
        if failed.any():
            reasons[reason] = reasons.get(reason, 0) + int(failed.sum())
        ok = ok & mask

    sel = _selector_mask(sess, task)
    if sel is not None:
        apply(sel, R_SELECTOR)
    if extra is not None:
        ok = ok & extra
    idle_cpu = sess.cap_cpu - sess.used_cpu
    idle_mem = sess.cap_mem - sess.used_mem
    idle_ok = np.ones(len(ok), dtype=bool)
    if req.cpu_m:
        apply(idle_cpu + sess.rel_cpu >= req.cpu_m, R_CPU)
        idle_ok &= idle_cpu >= req.cpu_m
    if req.memory:
        apply(idle_mem + sess.rel_mem >= req.memory, R_MEM)
        idle_ok &= idle_mem >= req.memory
    if req.gpus:
        idle_gpu = sess.cap_gpu - sess.used_gpu
        apply(idle_gpu + sess.rel_gpu >= req.gpus, R_GPU)
        idle_ok &= idle_gpu >= req.gpus
    apply(sess.used_pods < sess.max_pods, R_PODS)
    if req.is_shared:
        if req.gpu_memory_mib:
            apply(sess.gpu_mem_synced & (sess.gpu_mem >= req.gpu_memory_mib), R_GPU_MEM)
        shared_ok = np.zeros(len(ok), dtype=bool)
        shared_idle = np.zeros(len(ok), dtype=bool)
        for node in np.flatnonzero(ok):
            fitting, idle_whole, rel_whole = _shared_candidates(sess, task, int(node))
            cost = sess.device_cost(req, int(node))
            new_slots_ok = sess.used_pods[node] + 2 <= sess.max_pods[node]
            wholes = (idle_whole + rel_whole) if new_slots_ok else 0
            if len(fitting) + wholes >= req.fraction_devices:
                shared_ok[node] = True
                idle_groups = sum(1 for g in fitting if MILLI - g.used - cost >= 0)
                idle_wholes = idle_whole if new_slots_ok else 0
                shared_idle[node] = idle_groups + idle_wholes >= req.fraction_devices
        apply(shared_ok, R_GPU)
        idle_ok &= shared_idle
    return ok, ok & idle_ok, {k: v for k, v in reasons.items() if v}


def scores(sess: Session, task: Task, fits: BoolArray, fits_idle: BoolArray
           ) -> npt.NDArray[np.float64]:
    req = task.req
    cfg = sess.config.placement
    if req.wants_gpu:
        free = sess.free_gpu().astype(np.float64)
        total = sess.cap_gpu.astype(np.float64)
        strategy = cfg.gpu
    else:
        free = sess.free_cpu().astype(np.float64)
        total = sess.cap_cpu.astype(np.float64)
        strategy = cfg.cpu
    has = total > 0
    if strategy == "spread":
        base = np.where(has, free / np.where(has, total, 1.0), 0.0)
    else:
        cand = sess.schedulable & has
        if cand.any():
            lo, hi = free[cand].min(), free[cand].max()
            base = np.full(len(free), 9.0) if hi == lo else 9.0 * (1.0 - (free - lo) / (hi - lo))
        else:
            base = np.zeros(len(free))
        base = np.where(has, base, 0.0)
    score = base + np.where(fits_idle, 100.0, 0.0)
    if not req.wants_gpu:
        score += np.where(sess.cap_gpu == 0, 10.0, 0.0)
    if cfg.gpu != "spread" and not req.gpus:
        score += 1000.0 * _sharing_bonus(sess, task, fits)
    return score


def _sharing_bonus(sess: Session, task: Task, fits: BoolArray) -> npt.NDArray[np.float64]:
    bonus = np.zeros(len(fits))
    for node in np.flatnonzero(fits):
        groups = sess.groups[int(node)]
        if not groups:
            continue
        cost = sess.device_cost(task.req, int(node)) if task.req.is_shared else 0
        if any(MILLI - g.used + g.releasing - cost >= 0 and g.used < MILLI
               for g in groups.values()):
            bonus[node] = 1.0
    return bonus


def choose_devices(sess: Session, task: Task, node: int) -> tuple[tuple[str, ...],
                                                                   tuple[str, ...], bool]:
    """Shared devices for a fractional task on `node`: (groups, new groups, all on idle)."""
    req = task.req
    cost = sess.device_cost(req, node)
    fitting, idle_whole, rel_whole = _shared_candidates(sess, task, node)
    pack = _device_order(sess) != "gpuspread"
    cands: list[tuple[float, int, str | None, bool]] = []
    for order, g in enumerate(sorted(fitting, key=lambda g: g.gid)):
        used = g.used / MILLI
        score = used if pack else 1.0 - used
        cands.append((score, order, g.gid, MILLI - g.used - cost >= 0))
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
            gid = sess.new_group_id(node)
            new.append(gid)
        groups.append(gid)
    return tuple(groups), tuple(new), on_idle


def choose(sess: Session, task: Task, extra: BoolArray | None = None
           ) -> tuple[Choice | None, dict[str, int]]:
    """Best node for `task`, or None with the failed-predicate histogram. A virtually evicted
    victim is placed like any task; if that lands it where it was, the session un-evicts it."""
    fits, fits_idle, reasons = feasible(sess, task, extra)
    if not fits.any():
        return None, reasons
    score = scores(sess, task, fits, fits_idle)
    node = int(np.argmax(np.where(fits, score, -np.inf)))
    if task.req.is_shared:
        groups, new, on_idle = choose_devices(sess, task, node)
        return Choice(node, groups, new, on_idle and bool(fits_idle[node])), reasons
    return Choice(node, (), (), bool(fits_idle[node])), reasons
