"""Alibaba `cluster-trace-gpu-v2023` ("openb") files: GPU node list and pod lists.

Files are read as `<name>.csv` or `<name>.csv.gz` from a data directory: `--data-dir`, else
`$KAI_RAY_OPENB_DIR`, else the copy in the repository (`benchmarks/data/openb/`, gzipped).
The 5-column multigpu pod lists (no gpu_spec) are accepted.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kai_ray.core import packing
from kai_ray.core.packing import GPU_MILLI, NodeState, PodRequest, ShapeSet

REPO_DATA_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "openb"
NODE_FILE = "openb_node_list_gpu_node"
EXPECTED_FILE = "fgd_paper_expected_results_median"
POPULARITY_THRESHOLD = 0.95  # FGD's --pod-popularity-threshold 95


def data_dir(arg: str | None = None) -> Path:
    d = Path(arg or os.environ.get("KAI_RAY_OPENB_DIR") or REPO_DATA_DIR)
    if not d.is_dir():
        raise FileNotFoundError(f"openb data directory not found: {d} (use --data-dir)")
    return d


def open_csv(directory: Path, name: str) -> list[dict[str, str]]:
    for suffix in (".csv", ".csv.gz"):
        p = directory / (name + suffix)
        if p.is_file():
            raw = gzip.decompress(p.read_bytes()) if suffix.endswith(".gz") else p.read_bytes()
            return list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))
    raise FileNotFoundError(f"{name}.csv(.gz) not found in {directory}")


def _int(row: dict[str, str], field: str, where: str) -> int:
    try:
        return int(float(row[field]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"{where}: field {field!r} is missing or not a number "
                         f"({row.get(field)!r})") from e


@dataclass
class Cluster:
    names: list[str]  # sorted by name: array index order = the tie-break order
    models: list[str]  # model id -> name
    cpu: np.ndarray  # (N,) capacity milli-CPU
    mem: np.ndarray  # (N,) MiB
    gpus: np.ndarray  # (N,) device count
    model: np.ndarray  # (N,) model id (-1: none)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpus.sum()) * GPU_MILLI

    def fresh_state(self) -> NodeState:
        gmax = max(int(self.gpus.max()), 1)
        gf = np.where(np.arange(gmax)[None, :] < self.gpus[:, None], GPU_MILLI, -1)
        return NodeState(self.cpu.astype(np.int64).copy(), self.mem.astype(np.int64).copy(),
                         gf.astype(np.int64), self.model.astype(np.int64).copy())

    def subset(self, idx: np.ndarray) -> Cluster:
        return Cluster([self.names[i] for i in idx], self.models, self.cpu[idx], self.mem[idx],
                       self.gpus[idx], self.model[idx])


def load_cluster(directory: Path) -> Cluster:
    rows = open_csv(directory, NODE_FILE)
    rows.sort(key=lambda r: r["sn"])
    models = sorted({r["model"] for r in rows if r.get("model") and int(r["gpu"]) > 0})
    mid = {m: i for i, m in enumerate(models)}
    where = [f"{NODE_FILE} node {r.get('sn')}" for r in rows]
    return Cluster(
        names=[r["sn"] for r in rows],
        models=models,
        cpu=np.array([_int(r, "cpu_milli", w) for r, w in zip(rows, where, strict=True)]),
        mem=np.array([_int(r, "memory_mib", w) for r, w in zip(rows, where, strict=True)]),
        gpus=np.array([_int(r, "gpu", w) for r, w in zip(rows, where, strict=True)]),
        model=np.array([mid.get(r.get("model") or "", -1) if int(r["gpu"]) else -1
                        for r in rows]),
    )


@dataclass
class PodList:
    """Pods as columns, sorted by name (the order the reference shuffles from)."""

    names: list[str]
    cpu: np.ndarray
    mem: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray  # per GPU; 0 for CPU-only pods
    spec: list[str]  # "|"-joined allowed models, "" = any

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_milli(self) -> np.ndarray:
        return self.num_gpu * self.gpu_milli

    def request(self, i: int, models: list[str]) -> PodRequest:
        return PodRequest(int(self.cpu[i]), int(self.mem[i]), int(self.num_gpu[i]),
                          int(self.gpu_milli[i]), spec_mask(self.spec[i], models))


def spec_mask(spec: str, models: list[str]) -> np.ndarray | None:
    wanted = [s for s in spec.split("|") if s]
    if not wanted:
        return None
    return np.array([m in wanted for m in models], dtype=np.bool_)


def load_pods(directory: Path, trace: str) -> PodList:
    name = f"openb_pod_list_{trace}"
    rows = open_csv(directory, name)
    rows.sort(key=lambda r: r["name"])
    cpu, mem, ng, gm, spec = [], [], [], [], []
    for r in rows:
        w = f"{name} pod {r.get('name')}"
        n = _int(r, "num_gpu", w)
        milli = _int(r, "gpu_milli", w) if n else 0
        if n and milli <= 0:
            n = 0  # the reference treats a GPU pod with gpu_milli 0 as requesting no GPU
        if n > 1 and milli != GPU_MILLI:
            raise ValueError(f"{w}: multi-GPU pod with gpu_milli {milli} (expected 1000)")
        cpu.append(_int(r, "cpu_milli", w) or 100)  # k8s non-zero default request
        mem.append(_int(r, "memory_mib", w))
        ng.append(n)
        gm.append(min(milli, GPU_MILLI))
        spec.append("|".join(s for s in (r.get("gpu_spec") or "").split("|") if s) if n else "")
    return PodList([r["name"] for r in rows], np.array(cpu), np.array(mem), np.array(ng),
                   np.array(gm), spec)


def typical_shapes(pods: PodList, models: list[str],
                   threshold: float = POPULARITY_THRESHOLD) -> ShapeSet:
    """FGD's typical pods: most popular (cpu, gpu_milli, num_gpu, gpu_spec) shapes covering
    `threshold` of all pods (CPU-only ones included), weights renormalised to 1."""
    specs = sorted(set(pods.spec))
    kind = np.array([specs.index(s) for s in pods.spec], dtype=np.int64)
    masks = [spec_mask(s, models) for s in specs]
    allowed = np.array([np.ones(len(models), dtype=np.bool_) if m is None else m
                        for m in masks])[kind]
    return packing.typical_shapes(pods.cpu.astype(np.int64), pods.num_gpu.astype(np.int64),
                                  pods.gpu_milli.astype(np.int64), allowed, threshold, kind)


def load_expected(directory: Path) -> dict[tuple[str, str, str], np.ndarray]:
    """FGD's published medians: (trace, policy, metric) -> values at 0..130 % arrival."""
    out: dict[tuple[str, str, str], np.ndarray] = {}
    for r in open_csv(directory, EXPECTED_FILE):
        trace = r["workload"].removeprefix("openb_pod_list_")
        vals = np.array([float(r[str(i)]) if r.get(str(i)) else np.nan for i in range(131)])
        out[(trace, r["policy"], r["metric"])] = vals
    return out
