"""The FGD evaluation protocol (Weng et al., ATC '23), re-implemented.

Per (trace, policy, seed): pods sorted by name are shuffled with the seed, then pods resampled
from the trace are appended until the submitted GPU demand would exceed 130 % of the cluster's
GPU capacity (the reference's stopping test compares the per-GPU milli of the next pod, kept as
is). Pods arrive one by one and are placed once, never removed; a pod that fits nowhere stays
unallocated. After every arrival we record allocated GPU milli, arrived GPU milli and the
fragmented GPU milli (FGD's definition against the trace's typical shapes). Curves are
discretised like the reference's analysis: at each integer arrived-% x, the mean of the records
whose arrived-% rounds to x (or to x±1 if none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kai_ray.core import packing as pk
from kai_ray.sim.packing.trace import Cluster, PodList

TUNE_RATIO = 1.3
SEEDS = tuple(range(42, 52))
SIM_POLICIES = ("random", *pk.POLICIES)


def build_workload(pods: PodList, capacity_milli: int, seed: int,
                   ratio: float = TUNE_RATIO) -> np.ndarray:
    """Arrival order as indices into `pods` (shuffled originals, then resampled extras)."""
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(pods)))
    total_milli = pods.total_milli
    submitted = int(total_milli.sum())
    target = ratio * capacity_milli
    if submitted < target:
        while True:
            i = int(rng.integers(len(pods)))
            if submitted + int(pods.gpu_milli[i]) > target:
                break
            submitted += int(total_milli[i])
            order.append(i)
    else:
        while submitted > target and order:
            j = int(rng.integers(len(order)))
            submitted -= int(total_milli[order.pop(j)])
    return np.array(order, dtype=np.int64)


@dataclass
class RunResult:
    policy: str
    seed: int
    arrived: np.ndarray  # (P,) cumulative arrived GPU milli after each pod
    allocated: np.ndarray  # (P,) allocated GPU milli after each pod
    frag: np.ndarray  # (P,) fragmented GPU milli after each pod
    capacity_milli: int
    placed: int
    failed: int
    place_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per pod

    def curve(self, metric: str = "unallocated") -> np.ndarray:
        """(131,) values at arrived 0..130 % of capacity (NaN where no record)."""
        cap = self.capacity_milli / 100.0
        x = np.round(self.arrived / cap)
        alloc = np.round(self.allocated / cap, 2)
        if metric == "unallocated":
            y = 100.0 - alloc
        elif metric == "frag_pct":
            y = self.frag / cap
        elif metric == "frag_ratio":
            idle = self.capacity_milli - self.allocated
            y = np.where(idle > 0, 100.0 * self.frag / np.maximum(idle, 1), 0.0)
        else:
            raise ValueError(f"unknown metric {metric!r}")
        out = np.full(131, np.nan)
        for a in range(131):
            sel = x == a
            if not sel.any():
                sel = (x >= a - 1) & (x <= a + 1)
            if sel.any():
                out[a] = round(float(y[sel].mean()), 2)
        return out


def run(cluster: Cluster, pods: PodList, policy: str, seed: int, shapes: pk.ShapeSet,
        order: np.ndarray | None = None, timing: bool = False) -> RunResult:
    if policy not in SIM_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(SIM_POLICIES)}")
    cap = cluster.gpu_capacity_milli
    if order is None:
        order = build_workload(pods, cap, seed)
    state = cluster.fresh_state()
    rng = np.random.default_rng([seed, 7])  # Random policy only; independent of the workload
    node_frag = pk.frag_amount(state, shapes)
    reqs: dict[int, pk.PodRequest] = {}
    n = order.shape[0]
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n)
    secs = np.zeros(n if timing else 0)
    acc = used = placed = 0
    total_frag = float(node_frag.sum())
    for t, i in enumerate(order.tolist()):
        req = reqs.get(i)
        if req is None:
            req = reqs[i] = pods.request(i, cluster.models)
        acc += req.total_gpu_milli
        t0 = time.perf_counter() if timing else 0.0
        choice = _place(policy, state, req, shapes, rng)
        if timing:
            secs[t] = time.perf_counter() - t0
        if choice is not None:
            node, devs = choice
            pk.apply(state, node, devs, req)
            used += req.total_gpu_milli
            placed += 1
            one = np.array([node])
            sub = pk.NodeState(state.cpu_free[one], state.mem_free[one], state.gpu_free[one],
                               state.model[one])
            new = float(pk.frag_amount(sub, shapes)[0])
            total_frag += new - float(node_frag[node])
            node_frag[node] = new
        arrived[t], allocated[t], frag[t] = acc, used, total_frag
    return RunResult(policy, seed, arrived, allocated, frag, cap, placed, n - placed, secs)


def _place(policy: str, state: pk.NodeState, req: pk.PodRequest, shapes: pk.ShapeSet,
           rng: np.random.Generator) -> tuple[int, np.ndarray] | None:
    if policy != "random":
        return pk.place(policy, state, req, shapes)
    ok = np.flatnonzero(pk.fits(state, req))
    if ok.shape[0] == 0:
        return None
    node = int(ok[rng.integers(ok.shape[0])])
    if req.shared:
        cand = np.flatnonzero(state.gpu_free[node] >= req.gpu_milli)
        return node, np.array([int(cand[rng.integers(cand.shape[0])])])
    return node, pk.choose_devices("best_fit", state, node, req)
