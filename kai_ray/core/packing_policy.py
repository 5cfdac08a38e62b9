"""The live scheduler's side of the fractional-GPU packing policies (kai_ray.core.packing).

With `SchedulerConfig.gpu_packing` set to a policy other than "kai" (e.g. "lookahead", which beats
FGD on the Alibaba openb trace), a GPU task's node and device come from that policy instead of
KAI's binpack + gpupack scores. The session is viewed as the policy's `NodeState` (free CPU,
memory, and free milli-GPU per device slot: shared devices first, then idle whole devices, then
used ones) and the typical pod shapes are those of the session's own pods. Tasks the policies do
not model (gpu-memory or multi-device fractions, or nothing fitting on idle resources) keep KAI's
rules.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kai_ray.core import packing
from kai_ray.core.jobs import Task
from kai_ray.core.model import MILLI
from kai_ray.core.scratch import Key
from kai_ray.core.state import Session

BoolArray = npt.NDArray[np.bool_]
MIB = 1024 * 1024


PRODUCT_LABEL = "nvidia.com/gpu.product"
# the session's typical GPU shapes (None: no GPU pods), computed once
TYPICAL_SHAPES: Key[packing.ShapeSet | None] = Key("typical shapes")


def _model_ids(sess: Session) -> tuple[npt.NDArray[np.int64], dict[str, int]]:
    """Each node's GPU model id (-1 without GPUs) and the ids by product label."""
    cluster = sess.cluster
    names: dict[str, int] = {}
    out = np.full(len(cluster.nodes), -1, dtype=np.int64)
    for i, labels in enumerate(cluster.node_labels):
        if cluster.cap_gpu[i] > 0:
            out[i] = names.setdefault(labels.get(PRODUCT_LABEL, ""), len(names))
    return out, names


def node_state(sess: Session) -> packing.NodeState:
    """The session's idle resources as the packing policies see them."""
    cluster = sess.cluster
    width = max(1, int(cluster.cap_gpu.max()) if len(cluster.nodes) else 1)
    j = np.arange(width)[None, :]
    groups = cluster.dev_on.sum(axis=1)[:, None]
    shared_free = np.full((len(cluster.nodes), width), 0, dtype=np.int64)
    cols = min(width, cluster.dev_used.shape[1])
    shared_free[:, :cols] = MILLI - cluster.dev_used[:, :cols]
    idle_whole = np.maximum(cluster.cap_gpu - cluster.used_gpu, 0)[:, None]
    cap = cluster.cap_gpu[:, None]
    gpu_free = np.where(j < groups, shared_free,
                        np.where(j < groups + idle_whole, MILLI, np.where(j < cap, 0, -1)))
    return packing.NodeState(
        cpu_free=(cluster.cap_cpu - cluster.used_cpu).astype(np.int64),
        mem_free=((cluster.cap_mem - cluster.used_mem) // MIB).astype(np.int64),
        gpu_free=gpu_free.astype(np.int64), model=_model_ids(sess)[0])


def typical(sess: Session) -> packing.ShapeSet | None:
    """Typical shapes of the session's GPU pods (pending and placed), computed once."""
    if TYPICAL_SHAPES in sess.scratch:  # None kept too: no GPU pods
        return sess.scratch.get(TYPICAL_SHAPES)
    model_of, names = _model_ids(sess)
    # a pod pinned to GPU models (node selector or required node affinity on the product
    # label) may only use those models' nodes, as the trace's gpu_spec; one pinned to models
    # the cluster lacks never lands anywhere and is left out
    tasks: list[Task] = []
    pinned: list[set[int] | None] = []
    for t in sess.tasks:
        if not (t.req.gpus or t.req.gpu_fraction_milli):
            continue
        products = _pinned_products(t)
        if products is not None and not products & names.keys():
            continue
        tasks.append(t)
        pinned.append(None if products is None else {names[p] for p in products if p in names})
    shapes = None
    if tasks:
        cpu = np.array([t.req.cpu_m for t in tasks], dtype=np.int64)
        num = np.array([t.req.gpus or 1 for t in tasks], dtype=np.int64)
        milli = np.array([MILLI if t.req.gpus else t.req.gpu_fraction_milli for t in tasks],
                         dtype=np.int64)
        models = int(model_of.max()) + 1
        allowed = np.ones((len(tasks), max(models, 1)), dtype=np.bool_)
        for row, ids in enumerate(pinned):
            if ids is not None:
                allowed[row] = False
                allowed[row, sorted(ids)] = True
        shapes = packing.typical_shapes(cpu, num, milli, allowed)
    return sess.scratch.put(TYPICAL_SHAPES, shapes)


def _pinned_products(task: Task) -> set[str] | None:
    """The GPU models (product label values) `task` may use, None when not pinned: a node
    selector on the label, or a required node affinity every term of which has an In on it."""
    selected = dict(task.pod.node_selector).get(PRODUCT_LABEL)
    allowed = None if selected is None else {selected}
    if task.pod.node_affinity:
        per_term = [next((set(r.values) for r in term if not r.field
                          and r.key == PRODUCT_LABEL and r.operator == "In"), None)
                    for term in task.pod.node_affinity]
        if all(values is not None for values in per_term):
            union = set().union(*(v for v in per_term if v is not None))
            allowed = union if allowed is None else allowed & union
    return allowed


def request(task: Task) -> packing.PodRequest | None:
    req = task.req
    if req.gpu_memory_mib or req.fraction_devices != 1 or not req.wants_gpu:
        return None
    if req.gpus:
        return packing.PodRequest(req.cpu_m, req.memory // MIB, req.gpus, MILLI)
    return packing.PodRequest(req.cpu_m, req.memory // MIB, 1, req.gpu_fraction_milli)


def choose(sess: Session, task: Task, fits_idle: BoolArray
           ) -> tuple[int, tuple[str, ...], tuple[str, ...]] | None:
    """(node, shared groups, new groups) by the configured policy, or None for KAI's rules."""
    policy = sess.config.gpu_packing
    preq = request(task)
    if preq is None or not fits_idle.any():
        return None
    shapes = typical(sess)
    state = node_state(sess)
    score = packing.score(policy, state, preq, shapes)
    score = np.where(fits_idle, score, -np.inf)
    if not np.isfinite(score).any():
        return None
    node = int(np.argmax(score))
    if not preq.shared:
        return node, (), ()
    device = int(packing.choose_devices(policy, state, node, preq, shapes)[0])
    existing = list(sess.cluster.groups[node])
    if device < len(existing):
        return node, (existing[device],), ()
    gid = sess.cluster.new_group_id(node)
    return node, (gid,), (gid,)
