"""One read of the live cluster for the everyday tools, through the scheduler's own cache and
snapshot conversion (so a tool prints what the scheduler computes), and their table formatting."""


from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kai_ray.core.model import (
    SchedulerConfig,
    Snapshot,
)
from kai_ray.k8s import config_file, convert
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.client import api_client

Obj = dict[str, Any]
RESOURCES = ("cpu", "memory", "gpu")  # QueueShare tuple order


@dataclass
class Live:
    """One read of the cluster: the core snapshot plus the raw objects it came from."""

    snapshot: Snapshot
    problems: list[convert.Problem]
    podgroups: dict[str, Obj]  # by job key (`namespace/name`)
    pods: dict[str, Obj]  # by namespace/name
    queues: dict[str, Obj]  # by name
    taken: float  # wall-clock time of the read


def read_cluster(kubeconfig: str | None, config: str | None = None) -> Live:
    """List every kind the scheduler watches once (no watch threads: a one-shot command must
    exit cleanly) into the scheduler's own cache, and take its snapshot. `config`: the
    scheduler's configuration file, for its reservation namespace."""
    cache = ClusterCache(api_client(kubeconfig), reservation_namespace=config_file.load(
        config).binder().reservation_namespace)
    cache.list_once()
    snapshot, problems, podgroups = cache.snapshot()
    pods = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": p
            for p in cache.pods.values()}
    queues = {q["metadata"]["name"]: q for q in cache.queues.values()}
    return Live(snapshot, problems, podgroups, pods, queues, time.time())


def scheduler_config(path: str | None) -> SchedulerConfig:
    """The scheduler's YAML configuration (the chart's ConfigMap, `kai-ray run --config`)."""
    return config_file.read(path)[0]


def fmt(value: float, unlimited: bool = True) -> str:
    if unlimited and value == -1:
        return "-"
    return f"{round(value, 3):g}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


