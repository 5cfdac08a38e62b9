"""GPU placement policies: where a pod goes (node) and on which GPU devices.

Pure, vectorised numpy over nodes and devices; no I/O, clock or randomness. The scheduling core
and the trace simulator (`kai_ray.sim.packing`) call the same functions.

State and request model (integer units: milli-CPU, MiB, GPU thousandths):

- `NodeState`: per node free CPU (N,), free memory (N,), per-device free GPU milli (N, Gmax) with
  `-1` for device slots a node does not have, and a GPU model id (N,) (`-1`: no GPU).
  The arrays are owned by the caller, who applies placements with `apply()`.
- `PodRequest`: cpu, memory, `num_gpu`, `gpu_milli` per GPU (`< 1000` with `num_gpu == 1` is a
  shared/fractional request; whole-GPU requests use 1000), and an optional allowed-model mask.
- `ShapeSet`: the workload's typical pod shapes with popularity weights summing to 1. Computed by
  the caller (simulator: from the trace, like FGD; live scheduler: from pending/recent pods).

API: `fits(state, req) -> bool (N,)`; `score(policy, state, req, shapes) -> float (N,)` (higher is
better, `-inf` where the pod does not fit); `choose_devices(policy, state, node, req, shapes)`;
`place(...)` = best node (ties: lowest index, i.e. callers sort nodes by name) + its devices.

Policies (`POLICIES`):
- `best_fit`: FGD paper's Best-fit: least CPU+GPU left after placement, weights 0.5/0.5 of
  128 cores / 8 GPUs, integer-truncated score like the reference simulator; device: tightest fit.
- `packing`: FGD paper's GPU Packing: prefer partly used GPUs, then used nodes, then free nodes.
- `kai`: KAI's default: +1000 when an already shared GPU fits (gpusharingorder), node binpack
  0..9 on free whole GPUs (CPU millis for CPU-only pods); device: fullest device that fits.
- `fgd`: Fragmentation Gradient Descent (ATC '23): least growth of the expected fragmented GPU
  amount against the typical shapes, scored `int(100·sigmoid(-Δfrag/1000))` as the reference.
- `lookahead` (ours): FGD's integer score first, but with each node weighing the typical shapes
  as its arrivals will (`arrival_weight`: a shape pinned to GPU models spreads over those
  models by their GPU supply, so a scarce model's nodes mostly see the shapes pinned to it,
  not the global mix); then, among nodes in the same FGD bucket (the
  reference breaks those ties by node name alone), the least growth of a look-ahead waste,
  counted in whole GPUs; then node order. The look-ahead waste of a node is, per typical shape,
  the idle GPU that a stream of such pods could not use, given the expected leftover of each
  device when it keeps receiving fitting typical pods (`device_leftover`, a small dynamic
  programme over 0..1000 milli), whole free devices for multi-GPU shapes, and how many such pods
  the CPU (and memory, if the shapes carry it) still allow; weighted by the shapes' popularity.
  FGD only asks whether one pod of each shape still fits, so it is blind to the slivers a
  partly filled device leaves after the next pods and to CPU running out after a few.
  Devices: FGD's device score, then the look-ahead, then the fullest device.

Shapes that differ only by their allowed GPU models are evaluated once (`ShapeSet.base`), with a
per-model weight table; that keeps the model-pinned traces (127 typical shapes, 45 distinct
without the model constraint) about as fast as the unconstrained ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

GPU_MILLI = 1000
MAX_SPEC_CPU = 128_000  # Best-fit normaliser (reference simulator's MaxSpecCpu)
MAX_SPEC_GPU = 8_000  # Best-fit normaliser (MaxSpecGpu)
LOOKAHEAD_STEP = 1000.0  # look-ahead waste buckets (milli-GPU) inside an FGD score bucket

POLICIES = ("best_fit", "packing", "kai", "fgd", "lookahead")

IntArr = NDArray[np.int64]
FloatArr = NDArray[np.float64]
BoolArr = NDArray[np.bool_]


@dataclass
class NodeState:
    cpu_free: IntArr  # (N,) milli-CPU
    mem_free: IntArr  # (N,) MiB
    gpu_free: IntArr  # (N, G) milli-GPU per device, -1 = no such device
    model: IntArr  # (N,) GPU model id, -1 = no GPU

    def __post_init__(self) -> None:
        n = self.cpu_free.shape[0]
        if self.gpu_free.ndim != 2 or self.gpu_free.shape[0] != n:
            raise ValueError(f"NodeState.gpu_free: expected shape ({n}, G), "
                             f"got {self.gpu_free.shape}")
        for name in ("mem_free", "model"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"NodeState.{name}: expected shape ({n},), "
                                 f"got {getattr(self, name).shape}")

    @property
    def n_nodes(self) -> int:
        return int(self.cpu_free.shape[0])

    def copy(self) -> NodeState:
        return NodeState(self.cpu_free.copy(), self.mem_free.copy(), self.gpu_free.copy(),
                         self.model.copy())


@dataclass(frozen=True)
class PodRequest:
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0  # per GPU, 1..1000 when num_gpu > 0
    models: BoolArr | None = None  # (M,) allowed model ids; None = any

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("PodRequest.cpu_milli/memory_mib: must be >= 0")
        if self.num_gpu < 0:
            raise ValueError(f"PodRequest.num_gpu: must be >= 0, got {self.num_gpu}")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"PodRequest.gpu_milli: must be in 1..{GPU_MILLI} when num_gpu > 0, "
                             f"got {self.gpu_milli}")
        if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
            raise ValueError("PodRequest.gpu_milli: a multi-GPU request must use whole GPUs "
                             f"(1000), got {self.gpu_milli}")

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0


@dataclass(frozen=True)
class ShapeSet:
    """Typical pod shapes (K of them) and their popularity weights (sum 1)."""

    cpu_milli: IntArr  # (K,)
    num_gpu: IntArr  # (K,)
    gpu_milli: IntArr  # (K,) per GPU; 0 for CPU-only shapes
    allowed: BoolArr  # (K, M) allowed models per shape
    weight: FloatArr  # (K,)
    memory_mib: IntArr | None = None  # (K,) typical memory; None = not limiting (lookahead)
    # derived tables, computed once per shape set: by name, arrival weights by supply bytes
    _memo: dict[str | bytes, Any] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)

    def __post_init__(self) -> None:
        k = self.weight.shape[0]
        for name in ("cpu_milli", "num_gpu", "gpu_milli"):
            if getattr(self, name).shape != (k,):
                raise ValueError(f"ShapeSet.{name}: expected shape ({k},)")
        if self.memory_mib is not None and self.memory_mib.shape != (k,):
            raise ValueError(f"ShapeSet.memory_mib: expected shape ({k},)")
        if self.allowed.ndim != 2 or self.allowed.shape[0] != k:
            raise ValueError(f"ShapeSet.allowed: expected shape ({k}, M)")
        if k and abs(float(self.weight.sum()) - 1.0) > 1e-6:
            raise ValueError(f"ShapeSet.weight: must sum to 1, got {float(self.weight.sum())}")

    @property
    def leftover(self) -> FloatArr:
        """`device_leftover(self)`, computed once per shape set."""
        got: FloatArr | None = self._memo.get("leftover")
        if got is None:
            got = self._memo["leftover"] = device_leftover(self)
        return got

    @property
    def base(self) -> _Base:
        """The GPU shapes merged over their model constraint, computed once per shape set."""
        got: _Base | None = self._memo.get("base")
        if got is None:
            got = self._memo["base"] = _Base.of(self)
        return got

    def arrival_weight(self, supply: FloatArr) -> FloatArr:
        """`arrival_weight(self, supply)`, cached per supply vector."""
        key = np.asarray(supply, dtype=np.float64).tobytes()
        got: FloatArr | None = self._memo.get(key)
        if got is None:
            got = self._memo[key] = arrival_weight(self, supply)
        return got


@dataclass(frozen=True)
class _Base:
    """Distinct GPU shapes (B) ignoring the model constraint, and per-model weights: row m of
    `weight` (M + 1, B) sums the popularity of the shapes of each base that model m admits
    (row M: nodes without an allowed model, all zero)."""

    cpu: IntArr
    num: IntArr
    milli: IntArr
    mem: IntArr | None
    weight: FloatArr
    uniq_milli: IntArr
    milli_inv: IntArr
    shape_base: IntArr  # (Kg,) base index of each GPU shape (shapes with gpu_milli > 0, in order)

    @staticmethod
    def of(shapes: ShapeSet) -> _Base:
        gpu = np.flatnonzero(shapes.gpu_milli > 0)
        cols = [shapes.cpu_milli[gpu], shapes.num_gpu[gpu], shapes.gpu_milli[gpu]]
        if shapes.memory_mib is not None:
            cols.append(shapes.memory_mib[gpu])
        keys = np.stack(cols, axis=1).reshape(gpu.shape[0], len(cols))
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = np.asarray(inv, dtype=np.int64).reshape(-1)
        m = shapes.allowed.shape[1]
        weight = np.zeros((m + 1, uniq.shape[0]))
        contrib = shapes.allowed[gpu].T * shapes.weight[gpu][None, :]  # (M, Kg)
        for j in range(uniq.shape[0]):
            weight[:m, j] = contrib[:, inv == j].sum(axis=1)
        milli = uniq[:, 2].astype(np.int64)
        um, minv = np.unique(milli, return_inverse=True)
        return _Base(cpu=uniq[:, 0].astype(np.int64), num=uniq[:, 1].astype(np.int64),
                     milli=milli, mem=uniq[:, 3].astype(np.int64) if len(cols) == 4 else None,
                     weight=weight, uniq_milli=um.astype(np.int64),
                     milli_inv=np.asarray(minv, dtype=np.int64).reshape(-1), shape_base=inv)


def typical_shapes(cpu_milli: IntArr, num_gpu: IntArr, gpu_milli: IntArr, allowed: BoolArr,
                   threshold: float = 0.95, kind: IntArr | None = None) -> ShapeSet:
    """FGD's typical pod shapes from a pod population (P pods).

    Shapes are (cpu, gpu_milli, num_gpu, kind) keys, `kind` (P,) telling apart pods with
    different model constraints (default: the rows of `allowed`, (P, M)). The most popular
    shapes (ties: larger key first) are taken until they cover `threshold` of the pods; their
    weights are renormalised to 1. CPU-only pods count as shapes too (gpu_milli 0). The live
    scheduler passes its pending and recently placed pods; the simulator the trace.
    """
    p = cpu_milli.shape[0]
    if p == 0:
        raise ValueError("typical_shapes: needs at least one pod")
    if kind is None:
        _, kind = np.unique(allowed, axis=0, return_inverse=True)
        kind = np.asarray(kind, dtype=np.int64).reshape(-1)
    keys = np.stack([cpu_milli, gpu_milli, num_gpu, kind], axis=1).astype(np.int64)
    uniq, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    order = np.lexsort((-uniq[:, 3], -uniq[:, 2], -uniq[:, 1], -uniq[:, 0], -counts))
    cum = np.cumsum(counts[order])
    take = int(np.searchsorted(cum, threshold * p, side="left")) + 1
    sel = order[: min(take, order.shape[0])]
    w = counts[sel].astype(np.float64)
    return ShapeSet(
        cpu_milli=uniq[sel, 0].copy(), num_gpu=uniq[sel, 2].copy(),
        gpu_milli=uniq[sel, 1].copy(), allowed=allowed[first[sel]].copy(), weight=w / w.sum())


# ----------------------------------------------------------------------------------- feasibility

def model_ok(state: NodeState, models: BoolArr | None) -> BoolArr:
    """Nodes whose GPU model is allowed (all nodes with a GPU when `models` is None)."""
    has_gpu = state.model >= 0
    if models is None:
        return has_gpu
    idx = np.clip(state.model, 0, max(models.shape[0] - 1, 0))
    return np.asarray(has_gpu & (state.model < models.shape[0]) & models[idx], dtype=np.bool_)


def fits(state: NodeState, req: PodRequest) -> BoolArr:
    """Nodes where the pod fits: CPU, memory, and enough devices with `gpu_milli` free each."""
    ok = (state.cpu_free >= req.cpu_milli) & (state.mem_free >= req.memory_mib)
    if req.num_gpu == 0:
        return ok
    ndev = (state.gpu_free >= req.gpu_milli).sum(axis=1)
    return np.asarray(ok & model_ok(state, req.models) & (ndev >= req.num_gpu), dtype=np.bool_)


def choose_devices(policy: str, state: NodeState, node: int, req: PodRequest,
                   shapes: ShapeSet | None = None) -> IntArr:
    """Device indices on `node` for the request (empty for CPU-only pods).

    Whole GPUs: the lowest-index fully free devices (all policies). Shared request: one device,
    per policy (best_fit/packing/kai: the fullest device that fits; fgd: the device with the best
    integer FGD score, first index on ties; lookahead: the best integer FGD score, then the least
    look-ahead waste growth, then the fullest device).
    """
    _check_policy(policy)
    if req.num_gpu == 0:
        return np.zeros(0, dtype=np.int64)
    row = state.gpu_free[node]
    if not req.shared:
        free = np.flatnonzero(row >= GPU_MILLI)
        if free.shape[0] < req.num_gpu:
            raise ValueError(f"node {node}: {free.shape[0]} free GPUs, request needs "
                             f"{req.num_gpu}")
        return free[: req.num_gpu].astype(np.int64)
    cand = np.flatnonzero(row >= req.gpu_milli)
    if cand.shape[0] == 0:
        raise ValueError(f"node {node}: no device has {req.gpu_milli} milli-GPU free")
    if policy in ("fgd", "lookahead"):
        if shapes is None:
            raise ValueError(f"policy {policy}: needs the typical shapes")
        fgd = _fgd_int_score(_shared_frag_delta(state, np.array([node]), req, shapes)[0])
        fits_dev = row >= req.gpu_milli
        if policy == "fgd":
            return np.array([int(np.argmax(np.where(fits_dev, fgd, -1)))], dtype=np.int64)
        g = row.shape[0]
        ahead = _fill_pair_delta(state, np.array([node]), np.zeros(g, dtype=np.int64), row, req,
                                 shapes, shapes.leftover)
        key = np.where(fits_dev, fgd * 1e6 - ahead - 1e-6 * row, -np.inf)
        return np.array([int(np.argmax(key))], dtype=np.int64)
    # tightest fit; argmin returns the lowest index among equals
    masked = np.where(row >= req.gpu_milli, row, np.iinfo(np.int64).max)
    return np.array([int(np.argmin(masked))], dtype=np.int64)


def apply(state: NodeState, node: int, devices: IntArr, req: PodRequest) -> None:
    """Commit a placement into `state` (in place)."""
    state.cpu_free[node] -= req.cpu_milli
    state.mem_free[node] -= req.memory_mib
    if req.num_gpu:
        state.gpu_free[node, devices] -= req.gpu_milli


# ------------------------------------------------------------------------------ fragmentation
#
# Shapes that differ only by their GPU-model constraint share every per-node statistic; only the
# weight a node gives them differs (a shape counts for a node only if the node's model is
# allowed). So the maths runs over the distinct base shapes (cpu, num_gpu, gpu_milli[, memory])
# with per-node weights `W` (N, B) = the summed weight of the shapes of that base the node's
# model admits (`ShapeSet.base_weight`). The rest of the weight (shapes the node cannot host,
# CPU-only shapes) sees all idle GPU as fragment / waste.


def _model_rows(state: NodeState, shapes: ShapeSet) -> IntArr:
    """(N,) row of `shapes.base_weight` per node: its model id, or M (no access) without one."""
    m = shapes.allowed.shape[1]
    ok = (state.model >= 0) & (state.model < m)
    return np.where(ok, state.model, m).astype(np.int64)


def _shape_stats(gpu_free: IntArr, base: _Base) -> tuple[IntArr, FloatArr, FloatArr]:
    """Per node and base shape: #devices with >= shape milli free, Σ free on devices below it;
    total idle. Computed once per distinct milli value (a handful) and gathered to the shapes."""
    free = gpu_free[:, :, None]  # (N, G, 1)
    ge = free >= base.uniq_milli[None, None, :]  # (N, G, U)
    cnt = ge.sum(axis=1)  # (N, U)
    pos = np.maximum(free, 0)
    sless = np.where(ge, 0, pos).sum(axis=1).astype(np.float64)  # (N, U)
    total = pos[:, :, 0].sum(axis=1).astype(np.float64)  # (N,)
    return cnt[:, base.milli_inv], sless[:, base.milli_inv], total


def _frag(cpu_free: IntArr, cnt: IntArr, sless: FloatArr, total: FloatArr, w: FloatArr,
          base: _Base) -> FloatArr:
    """Expected fragmented milli-GPU (FGD definition) from per-shape statistics (any leading dims).

    For each shape: if the node can host it (model, CPU, enough devices) only devices too small
    for it are fragment; otherwise (and for CPU-only shapes) all idle GPU is fragment.
    """
    host = (cpu_free[..., None] >= base.cpu) & (cnt >= base.num)
    saved = np.where(host, total[..., None] - sless, 0.0)
    return np.asarray(total - (saved * w).sum(axis=-1), dtype=np.float64)


def frag_amount(state: NodeState, shapes: ShapeSet) -> FloatArr:
    """(N,) expected fragmented GPU milli per node against the typical shapes (FGD's F_n(M))."""
    base = shapes.base
    cnt, sless, total = _shape_stats(state.gpu_free, base)
    return _frag(state.cpu_free, cnt, sless, total,
                 base.weight[_model_rows(state, shapes)], base)


def _shared_frag_delta(state: NodeState, nodes: IntArr, req: PodRequest,
                       shapes: ShapeSet) -> FloatArr:
    """(len(nodes), G) fragmentation growth if the shared request lands on each device.

    Devices that cannot take it get +inf.
    """
    gf = state.gpu_free[nodes]  # (n, G)
    n, g = gf.shape
    rows = np.repeat(np.arange(n), g)
    d = _pair_delta(state, nodes, rows, gf.reshape(-1), req, shapes).reshape(n, g)
    return np.where(gf >= req.gpu_milli, d, np.inf)


def _pair_delta(state: NodeState, nodes: IntArr, rows: IntArr, free: IntArr, req: PodRequest,
                shapes: ShapeSet, weights: FloatArr | None = None) -> FloatArr:
    """Fragmentation growth for (node row, device free value) pairs: the device goes from
    `free` to `free - gpu_milli` and the node's CPU drops by the request. `weights`: the
    (M + 1, B) per-model shape weights (default `shapes.base.weight`)."""
    base = shapes.base
    gf = state.gpu_free[nodes]
    cnt, sless, total = _shape_stats(gf, base)
    w = (base.weight if weights is None else weights)[_model_rows(state, shapes)[nodes]]
    cpu = state.cpu_free[nodes]
    before = _frag(cpu, cnt, sless, total, w, base)
    m = base.milli[None, :]
    f = free[:, None]  # (P, 1)
    f2 = f - req.gpu_milli
    cnt2 = cnt[rows] - (f >= m) + (f2 >= m)  # (P, B)
    sless2 = (sless[rows] - np.where((f >= 0) & (f < m), f, 0)
              + np.where((f2 >= 0) & (f2 < m), f2, 0))
    after = _frag(cpu[rows] - req.cpu_milli, cnt2, sless2, total[rows] - req.gpu_milli,
                  w[rows], base)
    return np.asarray(after - before[rows], dtype=np.float64)


def _distinct_pairs(gf: IntArr, milli: int) -> tuple[IntArr, IntArr]:
    """(row, free value) pairs of devices that fit `milli`; equal values on a node once."""
    r, c = np.nonzero(gf >= milli)
    key = r * (GPU_MILLI + 1) + gf[r, c]
    _, first = np.unique(key, return_index=True)
    return r[first], gf[r[first], c[first]]


def _shared_best_delta(state: NodeState, nodes: IntArr, req: PodRequest, shapes: ShapeSet,
                       weights: FloatArr | None = None) -> FloatArr:
    """(len(nodes),) least growth over a node's devices; equal free values are evaluated once."""
    rows, free = _distinct_pairs(state.gpu_free[nodes], req.gpu_milli)
    d = _pair_delta(state, nodes, rows, free, req, shapes, weights)
    out = np.full(nodes.shape[0], np.inf)
    np.minimum.at(out, rows, d)
    return out


def frag_delta(state: NodeState, req: PodRequest, shapes: ShapeSet,
               nodes: IntArr | None = None, weights: FloatArr | None = None) -> FloatArr:
    """Fragmentation growth per node (best device for shared requests), +inf where it can't go.

    Whole-GPU requests take fully free devices (which count towards no shape's fragment before
    or after), so only the device count, the idle total and the CPU change. `nodes` (indices)
    must all fit the request; without it every node is scored. `weights`: per-model shape
    weights (M + 1, B), default FGD's (`shapes.base.weight`, popularity).
    """
    if nodes is None:
        ok = fits(state, req)
        out = np.full(state.n_nodes, np.inf)
        out[ok] = frag_delta(state, req, shapes, np.flatnonzero(ok), weights)
        return out
    idx = nodes
    if req.shared:
        return _shared_best_delta(state, idx, req, shapes, weights)
    base = shapes.base
    gf = state.gpu_free[idx]
    cnt, sless, total = _shape_stats(gf, base)
    w = (base.weight if weights is None else weights)[_model_rows(state, shapes)[idx]]
    cpu = state.cpu_free[idx]
    before = _frag(cpu, cnt, sless, total, w, base)
    n = req.num_gpu
    after = _frag(cpu - req.cpu_milli, cnt - n, sless, total - GPU_MILLI * n, w, base)
    return np.asarray(after - before, dtype=np.float64)


def _fgd_int_score(delta: FloatArr) -> FloatArr:
    """Reference FGD node score: int64(sigmoid((before - after) / 1000) * 100)."""
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(delta / GPU_MILLI))
    return np.floor(sig * 100.0)


def model_supply(state: NodeState, shapes: ShapeSet) -> FloatArr:
    """(M,) GPU devices per model id in the cluster (slots, free or not)."""
    m = shapes.allowed.shape[1]
    slots = (state.gpu_free >= 0).sum(axis=1)
    counts = np.bincount(_model_rows(state, shapes), weights=slots, minlength=m + 1)[:m]
    return np.asarray(counts, dtype=np.float64)


def arrival_weight(shapes: ShapeSet, supply: FloatArr) -> FloatArr:
    """(M + 1, B) per-model shape weights as arrivals on a node of that model see them.

    A shape's pods spread over the models it allows, in proportion to their GPU `supply` (M,),
    so a node of a scarce model meets the shapes pinned to it far more often than their global
    popularity says (a pod pinned to one model of 4 % of the GPUs lands there every time, an
    unpinned one 4 % of the time). Each model's row is then rescaled to the total of its
    popularity row (`base.weight`), so only the mix of shapes a node expects changes, not how
    much of its idle GPU counts as unusable by the shapes it cannot host.
    """
    base = shapes.base
    m = shapes.allowed.shape[1]
    gpu = np.flatnonzero(shapes.gpu_milli > 0)
    sup = np.asarray(supply, dtype=np.float64)
    if sup.shape != (m,):
        raise ValueError(f"arrival_weight: supply must have shape ({m},), got {sup.shape}")
    allowed = shapes.allowed[gpu] & (sup > 0)[None, :]  # (Kg, M)
    reach = allowed @ sup  # GPU supply each shape can use
    share = np.where(allowed, sup[None, :] / np.maximum(reach, 1e-9)[:, None], 0.0)
    per_shape = share.T * shapes.weight[gpu][None, :]  # (M, Kg)
    out = np.zeros((m + 1, base.cpu.shape[0]))
    np.add.at(out[:m].T, base.shape_base, per_shape.T)
    got, want = out.sum(axis=1, keepdims=True), base.weight.sum(axis=1, keepdims=True)
    return np.asarray(np.where(got > 0, out * (want / np.where(got > 0, got, 1.0)), 0.0),
                      dtype=np.float64)


# ------------------------------------------------------------------------ look-ahead waste

def _leftover_dp(m: IntArr, w: FloatArr) -> FloatArr:
    """(1001,) L(f): f when no shape of milli `m` (weights `w`) fits, else the weighted mean of
    L(f - m_k) over the fitting ones."""
    out = np.arange(GPU_MILLI + 1, dtype=np.float64)
    keep = w > 0
    m, w = m[keep], w[keep]
    if m.shape[0] == 0:
        return out
    for f in range(int(m.min()), GPU_MILLI + 1):
        ok = m <= f
        out[f] = float((w[ok] * out[f - m[ok]]).sum() / w[ok].sum())
    return out


def device_leftover(shapes: ShapeSet) -> FloatArr:
    """(M + 1, 1001) expected milli a device with f free ends up wasting if it keeps receiving
    pods drawn from the single-GPU typical shapes that still fit, until none fits; row m uses
    the shapes model m admits, with their popularity (row M: no GPU model, L(f) = f)."""
    base = shapes.base
    one = (base.num == 1) & (base.milli > 0)
    return np.stack([_leftover_dp(base.milli[one], row[one]) for row in base.weight])


def _fill_stats(gpu_free: IntArr, leftover: FloatArr,
                mrow: IntArr) -> tuple[IntArr, FloatArr, FloatArr]:
    """Per node: fully free devices, idle milli, expected device leftover Σ L(free) (the
    leftover table row of the node's model `mrow`)."""
    pos = np.maximum(gpu_free, 0)
    full = (gpu_free >= GPU_MILLI).sum(axis=1)
    left = leftover[mrow[:, None], pos].sum(axis=1)
    return full, pos.sum(axis=1).astype(np.float64), left


def _fill_waste(cpu_free: IntArr, mem_free: IntArr, full: IntArr, idle: FloatArr,
                left: FloatArr, w: FloatArr, base: _Base) -> FloatArr:
    """Expected idle GPU milli that a stream of each typical shape could not use (any leading
    dims): single-GPU shapes can use the idle GPU minus the device leftover, multi-GPU shapes
    whole free devices in groups of num_gpu; both at most as many pods as CPU (and memory)
    still allow. Shapes the node cannot host use nothing."""
    cnt = cpu_free[..., None] // np.maximum(base.cpu, 1)
    if base.mem is not None:
        cnt = np.minimum(cnt, mem_free[..., None] // np.maximum(base.mem, 1))
    cnt = np.maximum(cnt, 0)
    multi = base.num > 1
    cnt = np.where(multi, np.minimum(cnt, full[..., None] // np.maximum(base.num, 1)), cnt)
    gpu_ok = np.where(multi, idle[..., None], (idle - left)[..., None])
    usable = np.minimum(cnt * (base.milli * base.num), gpu_ok)
    return np.asarray(idle - (usable * w).sum(axis=-1), dtype=np.float64)


def _leftover_table(shapes: ShapeSet, leftover: FloatArr | None) -> FloatArr:
    if leftover is None:
        return shapes.leftover
    if leftover.ndim == 1:  # one table for every model
        return np.broadcast_to(leftover, (shapes.base.weight.shape[0], leftover.shape[0]))
    return leftover


def fill_waste(state: NodeState, shapes: ShapeSet, leftover: FloatArr | None = None) -> FloatArr:
    """(N,) look-ahead waste per node (the `lookahead` policy's measure)."""
    lo = _leftover_table(shapes, leftover)
    mrow = _model_rows(state, shapes)
    full, idle, left = _fill_stats(state.gpu_free, lo, mrow)
    return _fill_waste(state.cpu_free, state.mem_free, full, idle, left,
                       shapes.base.weight[mrow], shapes.base)


def _fill_pair_delta(state: NodeState, nodes: IntArr, rows: IntArr, free: IntArr,
                     req: PodRequest, shapes: ShapeSet, leftover: FloatArr) -> FloatArr:
    """Look-ahead waste growth for (node row, device free value) pairs of a shared request."""
    base = shapes.base
    mrow = _model_rows(state, shapes)[nodes]
    full, idle, left = _fill_stats(state.gpu_free[nodes], leftover, mrow)
    w = base.weight[mrow]
    cpu, mem = state.cpu_free[nodes], state.mem_free[nodes]
    before = _fill_waste(cpu, mem, full, idle, left, w, base)
    f = np.maximum(free, 0)
    f2 = np.maximum(f - req.gpu_milli, 0)
    lr = mrow[rows]
    after = _fill_waste(cpu[rows] - req.cpu_milli, mem[rows] - req.memory_mib,
                        full[rows] - (f >= GPU_MILLI), idle[rows] - req.gpu_milli,
                        left[rows] - leftover[lr, f] + leftover[lr, f2], w[rows], base)
    return np.asarray(after - before[rows], dtype=np.float64)


def fill_delta(state: NodeState, req: PodRequest, shapes: ShapeSet,
               nodes: IntArr | None = None, leftover: FloatArr | None = None) -> FloatArr:
    """Look-ahead waste growth per node (best device for shared requests); +inf if no fit."""
    lo = _leftover_table(shapes, leftover)
    if nodes is None:
        ok = fits(state, req)
        out = np.full(state.n_nodes, np.inf)
        out[ok] = fill_delta(state, req, shapes, np.flatnonzero(ok), lo)
        return out
    if req.shared:
        rows, free = _distinct_pairs(state.gpu_free[nodes], req.gpu_milli)
        d = _fill_pair_delta(state, nodes, rows, free, req, shapes, lo)
        best = np.full(nodes.shape[0], np.inf)
        np.minimum.at(best, rows, d)
        return best
    base = shapes.base
    mrow = _model_rows(state, shapes)[nodes]
    full, idle, left = _fill_stats(state.gpu_free[nodes], lo, mrow)
    w = base.weight[mrow]
    cpu, mem = state.cpu_free[nodes], state.mem_free[nodes]
    before = _fill_waste(cpu, mem, full, idle, left, w, base)
    n = req.num_gpu
    gone = n * (lo[mrow, GPU_MILLI] - lo[mrow, 0])
    after = _fill_waste(cpu - req.cpu_milli, mem - req.memory_mib, full - n,
                        idle - GPU_MILLI * n, left - gone, w, base)
    return np.asarray(after - before, dtype=np.float64)


# ------------------------------------------------------------------------------------- scoring

def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")


def _best_fit_int(state: NodeState, req: PodRequest) -> FloatArr:
    gpu_left = np.maximum(state.gpu_free, 0).sum(axis=1)
    raw = (0.5 * (state.cpu_free - req.cpu_milli) / MAX_SPEC_CPU
           + 0.5 * (gpu_left - req.total_gpu_milli) / MAX_SPEC_GPU)
    return np.asarray(np.trunc((1.0 - raw) * 100.0), dtype=np.float64)


def _packing_int(state: NodeState, req: PodRequest) -> FloatArr:
    n = state.n_nodes
    if req.num_gpu == 0:
        return np.zeros(n)
    gf = state.gpu_free
    ndev = (gf >= 0).sum(axis=1)
    full = (gf == GPU_MILLI).sum(axis=1)
    case3 = np.maximum(100 // 3 - full, full).astype(np.float64)
    if req.shared:
        # tightest device that fits; it is fully free only if no partly used device fits
        masked = np.where(gf >= req.gpu_milli, gf, np.iinfo(np.int64).max)
        tight = masked.min(axis=1)
        case1 = np.maximum(100 - (tight * 100 // GPU_MILLI) // 10, 50).astype(np.float64)
        case2 = np.full(n, max(50 - 1, 33), dtype=np.float64)
        s = np.where(tight >= GPU_MILLI, case2, case1)
    else:
        s = np.full(n, float(max(50 - req.num_gpu, 33)))
    return np.where(full == ndev, case3, s)


def _kai(state: NodeState, req: PodRequest) -> FloatArr:
    gf = state.gpu_free
    if req.num_gpu == 0:
        free = state.cpu_free.astype(np.float64)
        partly = ((gf > 0) & (gf < GPU_MILLI)).any(axis=1)
        bonus = np.where(partly, 1000.0, 0.0)  # KAI quirk: portion 0 "fits" a shared device
    else:
        free = (gf == GPU_MILLI).sum(axis=1).astype(np.float64)
        fit_shared = ((gf >= req.gpu_milli) & (gf < GPU_MILLI)).any(axis=1)
        bonus = np.where(fit_shared, 1000.0, 0.0) if req.shared else np.zeros(state.n_nodes)
    lo, hi = free.min(), free.max()
    binpack = np.full(state.n_nodes, 9.0) if hi == lo else 9.0 * (1.0 - (free - lo) / (hi - lo))
    return np.asarray(bonus + binpack, dtype=np.float64)


def score(policy: str, state: NodeState, req: PodRequest,
          shapes: ShapeSet | None = None) -> FloatArr:
    """(N,) node scores, higher is better, -inf where the pod does not fit.

    `lookahead` (ours) = lexicographic (FGD's integer score with arrival weights, look-ahead
    waste growth in whole-GPU buckets, node order). Coarse buckets on purpose: exact-gradient
    rankings (tried: FGD's gradient or the look-ahead in float, with Best-fit ties) spread pods
    and lose to FGD, and finer look-ahead buckets lose on the model-constrained gpuspec traces.
    """
    _check_policy(policy)
    ok = fits(state, req)
    out = np.full(state.n_nodes, -np.inf)
    idx = np.flatnonzero(ok)
    if idx.shape[0] == 0:
        return out
    if policy == "best_fit":
        out[idx] = _best_fit_int(state, req)[idx]
    elif policy == "packing":
        out[idx] = _packing_int(state, req)[idx]
    elif policy == "kai":
        # binpack normalises over all nodes passed in, fitting or not (KAI behaviour)
        out[idx] = _kai(state, req)[idx]
    else:
        if shapes is None:
            raise ValueError(f"policy {policy}: needs the typical shapes")
        if policy == "fgd":
            out[idx] = _fgd_int_score(frag_delta(state, req, shapes, idx))
        else:
            arrivals = shapes.arrival_weight(model_supply(state, shapes))
            fgd = _fgd_int_score(frag_delta(state, req, shapes, idx, arrivals))
            ahead = fill_delta(state, req, shapes, idx)
            out[idx] = fgd * 1e6 + np.floor(-ahead / LOOKAHEAD_STEP)
    return out


def place(policy: str, state: NodeState, req: PodRequest,
          shapes: ShapeSet | None = None) -> tuple[int, IntArr] | None:
    """Best node (first index among equal scores) and its devices, or None if nothing fits."""
    s = score(policy, state, req, shapes)
    node = int(np.argmax(s))
    if not np.isfinite(s[node]):
        return None
    return node, choose_devices(policy, state, node, req, shapes)
