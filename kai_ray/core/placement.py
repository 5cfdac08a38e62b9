"""Choosing a node (and GPU devices) for one task: predicates and scores, vectorised over nodes.

Scores follow KAI's plugins: gpusharingorder +1000 when an already-shared device of
the node fits, nodeavailability +100 when the task fits without waiting for releasing resources,
resourcetype +10 for a CPU-only task on a CPU-only node, and nodeplacement 0..9 (binpack: fewer
free units scores higher, normalised over all candidate nodes; spread: free/total). Ties go to the
node that sorts first by name (nodes are indexed in name order).

A GPU task first looks up the nodes with GPU room in the session's index: a few are checked one
by one, many are walked in binpack order for a whole-GPU task; the array pass over every node is
what decides otherwise (and what the shortcuts are tested against).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kai_ray.core import packing_policy
from kai_ray.core.constraints import affinity_matches, untolerated
from kai_ray.core.model import Request
from kai_ray.core.scratch import Key
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
    if not task.node_selector and task.node_affinity is None:
        return None
    key = (task.node_selector, task.node_affinity)
    cache = sess.scratch.setdefault(SELECTOR_MASKS, dict)
    mask = cache.get(key)
    if mask is None:
        names = [n.name for n in sess.nodes]
        mask = np.array([all(labels.get(k) == v for k, v in task.node_selector)
                         and (task.node_affinity is None
                              or affinity_matches(task.node_affinity, name, labels))
                         for name, labels in zip(names, sess.node_labels, strict=True)],
                        dtype=bool)
        cache[key] = mask
    return mask


def _taint_masks(sess: Session, task: Task) -> tuple[BoolArray | None, list[tuple[BoolArray, str]]]:
    """Nodes whose taints the task tolerates (None: all), and per untolerated taint the mask of
    the nodes it does not keep the task off, with Kubernetes' wording."""
    if not sess.any_taints:
        return None, []
    cache = sess.scratch.setdefault(TAINT_MASKS, dict)
    known = cache.get(task.tolerations)
    if known is None:
        first = [untolerated(taints, task.tolerations) for taints in sess.node_taints]
        blocked = np.array([t is not None for t in first], dtype=bool)
        per_taint = [(np.array([t != taint for t in first], dtype=bool),
                      f"had untolerated taint {{{taint.key}: {taint.value}}}")
                     for taint in dict.fromkeys(t for t in first if t is not None)]
        known = cache[task.tolerations] = (~blocked if blocked.any() else None, per_taint)
    return known


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
    idle_whole = sess.at.cap_gpu[node] - sess.at.used_gpu[node]
    rel_whole = sess.at.rel_gpu[node]
    return fitting, idle_whole, rel_whole


def _predicates(sess: Session, task: Task) -> tuple[list[tuple[BoolArray, str]], BoolArray]:
    """Each predicate as (mask of nodes that pass, KAI's reason), and the fits-on-idle mask."""
    req = task.req
    preds: list[tuple[BoolArray, str]] = list(_taint_masks(sess, task)[1])
    sel = _selector_mask(sess, task)
    if sel is not None:
        preds.append((sel, R_SELECTOR))
    idle_ok = np.ones(len(sess.nodes), dtype=bool)
    if req.cpu_m:
        idle_cpu = sess.cap_cpu - sess.used_cpu
        preds.append((idle_cpu + sess.rel_cpu >= req.cpu_m, R_CPU))
        idle_ok &= idle_cpu >= req.cpu_m
    if req.memory:
        idle_mem = sess.cap_mem - sess.used_mem
        preds.append((idle_mem + sess.rel_mem >= req.memory, R_MEM))
        idle_ok &= idle_mem >= req.memory
    if req.gpus:
        idle_gpu = sess.cap_gpu - sess.used_gpu
        preds.append((idle_gpu + sess.rel_gpu >= req.gpus, R_GPU))
        idle_ok &= idle_gpu >= req.gpus
    preds.append((sess.used_pods + _pod_slots(req) <= sess.max_pods, R_PODS))
    if req.is_shared:
        if req.gpu_memory_mib:
            preds.append((sess.gpu_mem_synced & (sess.gpu_mem >= req.gpu_memory_mib), R_GPU_MEM))
        cost = _cost_vector(sess, task)[:, None]
        live = sess.dev_on & (sess.dev_rel < sess.dev_used)  # not entirely releasing
        fit = live & (MILLI - sess.dev_used + sess.dev_rel - cost >= 0)
        fit_groups = fit.sum(axis=1)
        # on idle: of those, the devices some unpipelined sharer holds with idle room (KAI's
        # EnoughIdleResourcesOnGpu, asked of fitting devices only: with pipelined sharers,
        # charged to releasing, the idle room may be more than the room)
        idle_groups = (fit & (sess.dev_used > 0) & (MILLI - sess.dev_used - cost >= 0)).sum(axis=1)
        idle_whole = sess.cap_gpu - sess.used_gpu
        rel_whole = sess.rel_gpu
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
    ok = sess.schedulable.copy()
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


def fits_node(sess: Session, task: Task, node: int) -> tuple[bool, bool]:
    """(fits, fits on idle) on one node, without touching the others (scalar fast path)."""
    req = task.req
    at = sess.at
    if not at.schedulable[node] or at.used_pods[node] + _pod_slots(req) > at.max_pods[node]:
        return False, False
    sel = _selector_mask(sess, task)
    if sel is not None and not sel[node]:
        return False, False
    tolerated = _taint_masks(sess, task)[0]
    if tolerated is not None and not tolerated[node]:
        return False, False
    idle_cpu = at.cap_cpu[node] - at.used_cpu[node]
    idle_mem = at.cap_mem[node] - at.used_mem[node]
    if idle_cpu + at.rel_cpu[node] < req.cpu_m:
        return False, False
    if idle_mem + at.rel_mem[node] < req.memory:
        return False, False
    idle = idle_cpu >= req.cpu_m and idle_mem >= req.memory
    idle_gpu = at.cap_gpu[node] - at.used_gpu[node]
    if req.gpus:
        if idle_gpu + at.rel_gpu[node] < req.gpus:
            return False, False
        return True, idle and idle_gpu >= req.gpus
    if req.is_shared:
        fits, devices_idle = _shared_fits(sess, task, node)
        return fits, idle and devices_idle
    return True, idle


def _shared_fits(sess: Session, task: Task, node: int) -> tuple[bool, bool]:
    """A shared-GPU task's devices on one node: (they fit, releasing room counted; they fit on
    idle room)."""
    req = task.req
    at = sess.at
    if req.gpu_memory_mib and not (at.gpu_mem_synced[node]
                                   and at.gpu_mem[node] >= req.gpu_memory_mib):
        return False, False
    fitting, idle_whole, rel_whole = _shared_candidates(sess, task, node)
    if len(fitting) + idle_whole + rel_whole < req.fraction_devices:
        return False, False
    cost = sess.device_cost(req, node)
    idle_groups = sum(1 for g in fitting if g.used > 0 and MILLI - g.used - cost >= 0)
    return True, idle_groups + idle_whole >= req.fraction_devices


def _available(sess: Session, task: Task) -> BoolArray:
    """Over all nodes, `shown_idle` for a shared-GPU task (see `available_on`)."""
    req = task.req
    ok = ((sess.cap_cpu - sess.used_cpu >= req.cpu_m)
          & (sess.cap_mem - sess.used_mem >= req.memory))
    cost = _cost_vector(sess, task)[:, None]
    live = sess.dev_on & (sess.dev_rel < sess.dev_used)
    fit = live & (MILLI - sess.dev_used + sess.dev_rel - cost >= 0)
    available: BoolArray = ok & (fit.sum(axis=1) + sess.cap_gpu - sess.used_gpu
                                 >= req.fraction_devices)
    return available


def available_on(sess: Session, task: Task, node: int) -> bool:
    """KAI's nodeavailability score (+100, IsTaskAllocatable) for a shared-GPU task: its CPU
    and memory fit on idle resources and, per device it asks, there is an idle whole GPU or a
    shared device it fits on with the releasing room counted
    (fractionTaskGpusAllocatableDeviceCount, node_info.go:327-348). Placing it on idle
    resources (bound, not pipelined) counts only a device's idle room."""
    at = sess.at
    req = task.req
    if (at.cap_cpu[node] - at.used_cpu[node] < req.cpu_m
            or at.cap_mem[node] - at.used_mem[node] < req.memory):
        return False
    fitting, idle_whole, _ = _shared_candidates(sess, task, node)
    return len(fitting) + idle_whole >= req.fraction_devices


def shown_idle(sess: Session, task: Task, node: int, idle: bool) -> bool:
    """Whether `node` scores +100 for fitting on idle resources, `idle` the placement's own
    test there: the same but for a shared-GPU task (`available_on`)."""
    return available_on(sess, task, node) if task.req.is_shared else idle


def sharing_bonus_on(sess: Session, task: Task, node: int) -> bool:
    if sess.config.placement.gpu == "spread" or task.req.gpus:
        return False
    cost = sess.device_cost(task.req, node) if task.req.is_shared else 0
    return any(_joinable(g.used, g.releasing, cost) for g in sess.groups[node].values())


def _joinable(used: int, releasing: int, cost: int) -> bool:
    """KAI's `IsTaskFitOnGpuGroup`: a shared device some sharer still holds (not all of it
    releasing) with room for `cost`, releasing room counted. A full device qualifies for a
    request of 0 (a CPU-only pod): KAI's gpusharingorder scores those nodes too."""
    return releasing < used and MILLI - used + releasing - cost >= 0


def scores(sess: Session, task: Task, fits: BoolArray, fits_idle: BoolArray,
           within: BoolArray | None = None) -> npt.NDArray[np.float64]:
    """KAI's node order scores; binpack normalises free amounts over the nodes `within`
    (default: every schedulable node)."""
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
        if within is not None:
            cand &= within
        if cand.any():
            lo, hi = free[cand].min(), free[cand].max()
            base = np.full(len(free), 9.0) if hi == lo else 9.0 * (1.0 - (free - lo) / (hi - lo))
        else:
            base = np.zeros(len(free))
        base = np.where(has, base, 0.0)
    if req.is_shared:
        fits_idle = fits & _available(sess, task)  # KAI's availability score (available_on)
    score = base + np.where(fits_idle, 100.0, 0.0)
    if not req.wants_gpu:
        score += np.where(sess.cap_gpu == 0, 10.0, 0.0)
    if cfg.gpu != "spread" and not req.gpus:
        score += 1000.0 * _sharing_bonus(sess, task, fits)
    return score


def _cost_vector(sess: Session, task: Task) -> npt.NDArray[np.int64]:
    """Milli of a device the task takes on each node (gpu-memory depends on the node)."""
    req = task.req
    if req.gpu_fraction_milli:
        return np.full(len(sess.nodes), req.gpu_fraction_milli, dtype=np.int64)
    if req.gpu_memory_mib:
        return -((-req.gpu_memory_mib * MILLI) // sess.gpu_mem)
    return np.zeros(len(sess.nodes), dtype=np.int64)


def _sharing_bonus(sess: Session, task: Task, fits: BoolArray) -> npt.NDArray[np.float64]:
    """1 where a shared device of the node can take the task (gpusharingorder; `_joinable`)."""
    cost = _cost_vector(sess, task)[:, None]
    joinable = (sess.dev_on & (sess.dev_rel < sess.dev_used)
                & (MILLI - sess.dev_used + sess.dev_rel - cost >= 0))
    return (joinable.any(axis=1) & fits).astype(np.float64)


def choose_devices(sess: Session, task: Task, node: int) -> tuple[tuple[str, ...],
                                                                   tuple[str, ...], bool]:
    """Shared devices for a fractional task on `node`: (groups, new groups, all on idle)."""
    req = task.req
    cost = sess.device_cost(req, node)
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
            gid = sess.new_group_id(node, new)
            new.append(gid)
        groups.append(gid)
    return tuple(groups), tuple(new), on_idle


# at most this many candidate nodes are checked one by one rather than as arrays
_FEW = 48


def choose(sess: Session, task: Task, explain: bool = True
           ) -> tuple[Choice | None, dict[str, int]]:
    """Best node for `task`, or None with the failed-predicate histogram (empty unless
    `explain`: simulations do not need it). A virtually evicted victim is placed like any task;
    if that lands it where it was, the session un-evicts it. Under a node filter (a victim
    scenario's nodes, `Session.node_filter`) only those nodes are candidates, and binpack
    scores are normalised over them (KAI's AllocateJob is handed that node list)."""
    if sess.node_filter is not None:
        return _choose_filtered(sess, task, sess.node_filter, explain)
    if task.req.gpus and sess.config.gpu_packing == "kai":
        few, order = _whole_candidates(sess, task.req.gpus)
        if few:
            return _choose_among(sess, task, sorted(order), explain)
        packed = _binpack_whole(sess, task, order)
        if packed is not None:
            return packed, {}
    elif task.req.gpu_fraction_milli and sess.config.gpu_packing == "kai":
        nodes = _few_fraction_candidates(sess, task.req.gpu_fraction_milli)
        if nodes is not None:
            return _choose_among(sess, task, nodes, explain)
    cand = _gpu_candidates(sess, task)
    if cand is not None and len(cand) <= _FEW:
        return _choose_among(sess, task, cand.tolist(), explain)
    if cand is not None:
        packed = _binpack_fraction(sess, task, cand)
        if packed is not None:
            return packed, {}
    fits, fits_idle, _ = feasible(sess, task)
    if not fits.any():
        return None, feasible(sess, task, explain=True)[2] if explain else {}
    if sess.config.gpu_packing != "kai" and task.req.wants_gpu:
        picked = packing_policy.choose(sess, task, fits_idle)
        if picked is not None:
            return Choice(picked[0], picked[1], picked[2], True), {}
    if np.count_nonzero(fits) == 1:
        node = int(np.flatnonzero(fits)[0])
    else:
        score = scores(sess, task, fits, fits_idle)
        node = int(np.argmax(np.where(fits, score, -np.inf)))
    return place_on(sess, task, node, bool(fits_idle[node])), {}


def _base_score(free: float, total: float, spread: bool, lo: float, hi: float) -> float:
    """One node's placement score before the idle and sharing terms, as `scores` has it: the
    free share (spread), or 0..9 falling with the free amount over [lo, hi] (binpack)."""
    if total <= 0:
        return 0.0
    if spread:
        return free / total
    if hi == lo:
        return 9.0
    return 9.0 * (1.0 - (free - lo) / (hi - lo))


def _fitting_among(sess: Session, task: Task, nodes: list[int],
                   test: Callable[[Session, Task, int], tuple[bool, bool]], explain: bool
                   ) -> tuple[list[tuple[int, bool]], tuple[Choice | None, dict[str, int]] | None]:
    """The (node, fits on idle) of `nodes` the task fits on by `test`, and `choose`'s answer
    when that settles it without scores (no node, with the reasons when `explain`; one node)."""
    fitting = []
    for node in nodes:
        fits, idle = test(sess, task, node)
        if fits:
            fitting.append((node, idle))
    if not fitting:
        return fitting, (None, feasible(sess, task, explain=True)[2] if explain else {})
    if len(fitting) == 1:
        return fitting, (place_on(sess, task, fitting[0][0], fitting[0][1]), {})
    return fitting, None


def _choose_filtered(sess: Session, task: Task, nodes: list[int], explain: bool
                     ) -> tuple[Choice | None, dict[str, int]]:
    """`choose` over `nodes` alone (in node order): the array path's predicates and scores,
    node by node, with binpack normalised over `nodes`. A scenario's nodes are few next to
    the cluster's, so this is cheaper than the array pass."""
    req = task.req
    if sess.config.gpu_packing != "kai" and req.wants_gpu:
        return _choose_masked(sess, task, nodes, explain)
    fitting, settled = _fitting_among(sess, task, nodes, _feasible_on, explain)
    if settled is not None:
        return settled
    at = sess.at
    cfg = sess.config.placement
    gpu = req.wants_gpu
    cap = at.cap_gpu if gpu else at.cap_cpu
    used = at.used_gpu if gpu else at.used_cpu
    rel = at.rel_gpu if gpu else at.rel_cpu
    spread = (cfg.gpu if gpu else cfg.cpu) == "spread"
    frees = [cap[n] - used[n] + rel[n] for n in nodes if at.schedulable[n] and cap[n] > 0]
    lo, hi = (float(min(frees)), float(max(frees))) if frees else (0.0, 0.0)
    bonus = cfg.gpu != "spread" and not req.gpus
    best: tuple[float, int, bool] | None = None
    for node, idle in fitting:
        free, total = float(cap[node] - used[node] + rel[node]), float(cap[node])
        base = 0.0 if not spread and not frees else _base_score(free, total, spread, lo, hi)
        value = base + (100.0 if shown_idle(sess, task, node, idle) else 0.0)
        if not gpu:
            value += 10.0 if at.cap_gpu[node] == 0 else 0.0
        if bonus:
            value += 1000.0 * (1.0 if sharing_bonus_on(sess, task, node) else 0.0)
        if best is None or value > best[0]:
            best = (value, node, idle)
    assert best is not None
    return place_on(sess, task, best[1], best[2]), {}


def _choose_masked(sess: Session, task: Task, nodes: list[int], explain: bool
                   ) -> tuple[Choice | None, dict[str, int]]:
    """`_choose_filtered` as the array path: the pass over every node, masked to `nodes`
    (a packing policy's scores need the whole pass; tests compare the two)."""
    within = np.zeros(len(sess.nodes), dtype=bool)
    within[nodes] = True
    fits, fits_idle, reasons = feasible(sess, task, explain=explain)
    fits &= within
    fits_idle &= within
    if not fits.any():
        return None, reasons
    if sess.config.gpu_packing != "kai" and task.req.wants_gpu:
        picked = packing_policy.choose(sess, task, fits_idle)
        if picked is not None:
            return Choice(picked[0], picked[1], picked[2], True), {}
    score = scores(sess, task, fits, fits_idle, within)
    node = int(np.argmax(np.where(fits, score, -np.inf)))
    return place_on(sess, task, node, bool(fits_idle[node])), {}


def _feasible_on(sess: Session, task: Task, node: int) -> tuple[bool, bool]:
    """`feasible` on one node, predicate for predicate: (fits with releasing, fits on idle).
    (`fits_node`, the fast paths' test, also wants idle CPU and memory for a request of
    none.)"""
    req = task.req
    at = sess.at
    if not at.schedulable[node]:
        return False, False
    sel = _selector_mask(sess, task)
    if sel is not None and not sel[node]:
        return False, False
    tolerated = _taint_masks(sess, task)[0]
    if tolerated is not None and not tolerated[node]:
        return False, False
    idle = True
    if req.cpu_m:
        idle_cpu = at.cap_cpu[node] - at.used_cpu[node]
        if idle_cpu + at.rel_cpu[node] < req.cpu_m:
            return False, False
        idle = idle_cpu >= req.cpu_m
    if req.memory:
        idle_mem = at.cap_mem[node] - at.used_mem[node]
        if idle_mem + at.rel_mem[node] < req.memory:
            return False, False
        idle = idle and idle_mem >= req.memory
    idle_gpu = at.cap_gpu[node] - at.used_gpu[node]
    if req.gpus:
        if idle_gpu + at.rel_gpu[node] < req.gpus:
            return False, False
        idle = idle and idle_gpu >= req.gpus
    if at.used_pods[node] + _pod_slots(req) > at.max_pods[node]:
        return False, False
    if req.is_shared:
        fits, devices_idle = _shared_fits(sess, task, node)
        return fits, idle and devices_idle
    return True, idle


def _whole_candidates(sess: Session, gpus: int) -> tuple[bool, list[int]]:
    """The nodes with `gpus` free whole GPUs or more (a superset of those a whole-GPU pod fits
    on), from the session's GPU room index, in binpack walk order: by free GPUs, then node.
    (few, nodes): when there are more than _FEW, only what a walk can reach is listed (the
    first _FEW + 1, enough to tell that more are left)."""
    by_free = sess.by_free
    values = sorted(v for v in by_free if v >= gpus)
    if sum(len(by_free[v]) for v in values) <= _FEW:
        return True, [node for v in values for node in by_free[v]]
    order: list[int] = []
    for v in values:
        order.extend(by_free[v][:_FEW + 1 - len(order)])
        if len(order) > _FEW:
            break
    return False, order


def _few_fraction_candidates(sess: Session, cost: int) -> list[int] | None:
    """The nodes with a shared device with `cost` room or a free whole GPU, in node order,
    from the session's buckets, when there are at most _FEW of them (else None: the array
    pass finds them)."""
    rooms = [nodes for room, nodes in sess.by_room.items() if room >= cost]
    wholes = sess.by_free.values()
    if sum(len(nodes) for nodes in rooms) + sum(len(nodes) for nodes in wholes) > _FEW:
        return None
    found: set[int] = set()
    for nodes in rooms:
        found.update(nodes)
    for whole in wholes:
        found.update(whole)
    return sorted(found)


def _gpu_candidates(sess: Session, task: Task) -> npt.NDArray[np.intp] | None:
    """The nodes with GPU room for fractional `task` (a superset of those it fits on), from
    the session's GPU room index: on a busy cluster most nodes are ruled out by it alone.
    (Whole-GPU pods: `_whole_candidates`.)"""
    req = task.req
    if sess.config.gpu_packing != "kai" or req.gpus:
        return None
    if req.gpu_fraction_milli:
        cand = np.flatnonzero((sess.dev_room_at >= req.gpu_fraction_milli)
                              | (sess.gpu_free_at >= 1))
    else:
        return None  # CPU-only or gpu-memory (its cost depends on the node): the array path
    return cand


def _binpack_whole(sess: Session, task: Task, order: list[int]) -> Choice | None:
    """Binpack for a whole-GPU task without scoring every node (`_walk` over more than _FEW
    candidates, `order` from `_whole_candidates`). None when that does not settle it: the
    array path decides."""
    if sess.config.placement.gpu == "spread" or not sess.free_counts:
        return None
    gpus = task.req.gpus
    # every node with that many idle GPUs is a candidate: those after position k are the
    # ones in all but those in the first k
    idle_fits = sum(count for value, count in sess.idle_counts.items() if value >= gpus)
    idle_at = sess.at.idle_at

    def idle_after(k: int) -> bool:
        return idle_fits > sum(1 for node in order[:k] if idle_at[node] >= gpus)

    return _walk(sess, task, order, idle_after, True)[0]


def _walk(sess: Session, task: Task, order: list[int], idle_after: Callable[[int], bool],
          more: bool) -> tuple[Choice | None, bool]:
    """The binpack winner among nodes in `order` (by free GPUs, then node; the first _FEW
    at least; `more`: there are more than _FEW) when they all score alike but for fitting
    on idle resources (100) and 0..9 falling with the node's free GPUs: the first node that
    fits on idle; when none can (a full cluster where only releasing resources are left),
    the first that fits at all. (When every node has as many free GPUs, the order is the
    nodes' order and the scores tie but for those 100: the same.) `idle_after(k)`: whether
    the task's GPUs may fit on idle resources on some node from position k on. Returns
    (choice, settled): not settled when the first _FEW nodes in that order leave it open;
    settled with no choice when no node fits."""
    first_fit = None
    first_idle = False
    for j, node in enumerate(order[:_FEW]):
        fits, idle = fits_node(sess, task, node)
        if fits and shown_idle(sess, task, node, idle):
            return place_on(sess, task, node, idle), True
        if fits and first_fit is None:
            first_fit, first_idle = node, idle
            if not idle_after(j + 1):
                return place_on(sess, task, node, idle), True  # nothing after it can win
    if first_fit is not None and not idle_after(_FEW):
        return place_on(sess, task, first_fit, first_idle), True
    return None, first_fit is None and not more


def _walk_array(sess: Session, task: Task, nodes: npt.NDArray[np.intp]
                ) -> tuple[Choice | None, bool]:
    """`_walk` over the nodes of an array, in any order."""
    order = nodes[np.lexsort((nodes, sess.gpu_free_at[nodes]))]
    return _walk(sess, task, order[:_FEW + 1].tolist(),
                 lambda k: _may_fit_on_idle(sess, task, order[k:]), len(order) > _FEW)


def _may_fit_on_idle(sess: Session, task: Task, nodes: npt.NDArray[np.intp]) -> bool:
    """Whether the task's GPUs could fit on idle resources on any of `nodes` (a necessary
    condition of the array path's fits-on-idle mask)."""
    if not len(nodes):
        return False
    idle_whole = sess.cap_gpu[nodes] - sess.used_gpu[nodes]
    req = task.req
    if req.gpus:
        return bool((idle_whole >= req.gpus).any())
    # (for a fraction, KAI's availability score: devices it fits on, releasing room counted)
    used, rel, cost = sess.dev_used[nodes], sess.dev_rel[nodes], req.gpu_fraction_milli
    fit = sess.dev_on[nodes] & (rel < used) & (MILLI - used + rel - cost >= 0)
    return bool((idle_whole + fit.sum(axis=1) >= req.fraction_devices).any())


def _binpack_fraction(sess: Session, task: Task, cand: npt.NDArray[np.intp]) -> Choice | None:
    """Binpack for a fractional task without scoring every node: a node with a partly used
    device the task fits on scores 1000 more than any other, so when some of those fit, the
    winner is among them; else among the others. Either way the rest of the score is as
    `_walk` has it. None when that does not settle it: the array path decides."""
    cost = task.req.gpu_fraction_milli
    if not cost or sess.config.placement.gpu == "spread" or not sess.free_counts:
        return None
    sharing = np.flatnonzero(sess.dev_room_at >= cost)  # all among `cand`
    if len(sharing):
        picked, settled = _walk_array(sess, task, sharing)
        if picked is not None or not settled:
            return picked
    return _walk_array(sess, task, cand)[0]  # none of the sharing nodes fits


def _choose_among(sess: Session, task: Task, nodes: list[int], explain: bool
                  ) -> tuple[Choice | None, dict[str, int]]:
    """`choose` over a few candidate nodes, node by node: the same predicates (`fits_node`)
    and the same scores as the array path, in the same float arithmetic, ties to the first."""
    fitting, settled = _fitting_among(sess, task, nodes, fits_node, explain)
    if settled is not None:
        return settled
    spread = sess.config.placement.gpu == "spread"
    lo = hi = 0
    if not spread and sess.free_counts:
        lo, hi = min(sess.free_counts), max(sess.free_counts)
    bonus = not spread and not task.req.gpus
    best: tuple[float, int, bool] | None = None
    for node, idle in fitting:
        free, total = float(sess.at.gpu_free_at[node]), float(sess.at.cap_gpu[node])
        base = _base_score(free, total, spread, lo, hi)
        score = base + (100.0 if shown_idle(sess, task, node, idle) else 0.0)
        if bonus:
            score += 1000.0 * (1.0 if sharing_bonus_on(sess, task, node) else 0.0)
        if best is None or score > best[0]:
            best = (score, node, idle)
    assert best is not None
    return place_on(sess, task, best[1], best[2]), {}


def place_on(sess: Session, task: Task, node: int, on_idle: bool) -> Choice:
    if task.req.is_shared:
        groups, new, devices_idle = choose_devices(sess, task, node)
        return Choice(node, groups, new, devices_idle and on_idle)
    return Choice(node, (), (), on_idle)
