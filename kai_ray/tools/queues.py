"""`kai-ray queues`: the queue tree with quota, limit, weight, allocation and fair share.

Fair shares and the pre-cycle allocation come from `schedule()` with no actions (the session's
fair-share pass); pending demand is the requested amount not yet allocated.
"""


from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from kai_ray.core.model import (
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.schedule import schedule
from kai_ray.tools.live import RESOURCES, Live, fmt, read_cluster, scheduler_config, table


def queue_rows(snapshot: Snapshot, config: SchedulerConfig, now: float) -> list[dict[str, Any]]:
    """Every queue the scheduler sees, in tree order, with its numbers per resource.

    Units: gpu in GPUs, cpu in cores, memory in GB (10^9 bytes). -1 = unlimited.
    """
    result = schedule(snapshot, dataclasses.replace(config, actions=()), now)
    spec = {q.name: q for q in snapshot.queues}
    children: dict[str | None, list[str]] = {}
    for name, share in result.queues.items():
        children.setdefault(share.parent, []).append(name)
    for kids in children.values():
        kids.sort(key=lambda n: (spec[n].created, n))
    rows: list[dict[str, Any]] = []

    def visit(name: str, depth: int) -> None:
        share = result.queues[name]
        q = spec[name]
        row: dict[str, Any] = {"name": name, "parent": share.parent, "depth": depth,
                               "priority": q.priority, "leaf": name not in children}
        for r, res in enumerate(RESOURCES):
            scale = {"cpu": 1000.0, "memory": 1e9, "gpu": 1.0}[res]
            weight = {"cpu": q.cpu.weight, "memory": q.memory.weight, "gpu": q.gpu.weight}[res]

            def unit(v: float, s: float = scale) -> float:
                return v if v == -1 else v / s

            row[res] = {"quota": unit(share.deserved[r]), "limit": unit(share.limit[r]),
                        "weight": weight, "allocated": unit(share.allocated[r]),
                        "allocated_non_preemptible": unit(share.allocated_non_preemptible[r]),
                        "fair_share": unit(share.fair_share[r]),
                        "pending": max(0.0, unit(share.requested[r] - share.allocated[r]))}
        rows.append(row)
        for child in children.get(name, []):
            visit(child, depth + 1)

    for root in children.get(None, []):
        visit(root, 0)
    return rows


def render_queues(rows: list[dict[str, Any]], problems: Iterable[str]) -> str:
    rows_out = []
    for row in rows:
        g, c, m = row["gpu"], row["cpu"], row["memory"]
        rows_out.append([
            "  " * row["depth"] + row["name"], str(row["priority"]),
            fmt(g["quota"]), fmt(g["limit"]), fmt(g["weight"], False),
            fmt(g["allocated"], False), fmt(g["fair_share"], False),
            fmt(g["pending"], False),
            f"{fmt(c['allocated'], False)}/{fmt(c['fair_share'], False)}",
            f"{fmt(m['allocated'], False)}/{fmt(m['fair_share'], False)}",
        ])
    out = [table(["QUEUE", "PRIO", "GPU QUOTA", "LIMIT", "WEIGHT", "ALLOCATED", "FAIR SHARE",
                   "PENDING", "CPU ALLOC/FAIR", "MEM GB ALLOC/FAIR"], rows_out)]
    out.append("GPU columns in GPUs ('-' = unlimited); PENDING = requested but not allocated; "
               "fair share from the scheduler's own fair-share pass.")
    problems = list(problems)
    if problems:
        out.append("Problems:")
        out.extend(f"  {p}" for p in problems)
    return "\n".join(out)


def queue_problems(live: Live, rows: list[dict[str, Any]]) -> list[str]:
    shown = {r["name"] for r in rows}
    out = [str(p) for p in live.problems if p.kind == "Queue"]
    for name, obj in sorted(live.queues.items()):
        parent = (obj.get("spec") or {}).get("parentQueue")
        if name not in shown and not any(p.name == name for p in live.problems):
            why = ("is left out: it is under a queue on a parent cycle" if parent in live.queues
                   else "does not exist (orphan)")
            out.append(f"Queue {name}: spec.parentQueue: parent '{parent}' {why}; its jobs "
                       "are not scheduled")
    return out


def cmd_queues(args: argparse.Namespace) -> int:
    live = read_cluster(args.kubeconfig, getattr(args, "config", None))
    config = scheduler_config(getattr(args, "config", None))
    rows = queue_rows(live.snapshot, config, live.taken)
    problems = queue_problems(live, rows)
    if args.output == "json":
        print(json.dumps({"queues": rows, "problems": problems}, indent=2))
    else:
        print(render_queues(rows, problems))
    return 0


