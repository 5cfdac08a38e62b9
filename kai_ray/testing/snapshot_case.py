"""Write a fuzzer round's snapshot as a scenario case, to pin what the fuzzer found in a file.

    python3 -m kai_ray.testing.snapshot_case SEED ROUND [--id ID] [--run full_cycle]

prints one case for tests/scenarios/*.yaml: the snapshot `kai_fuzz --show SEED --rounds ROUND`
compares in its last round (the seed's cluster after ROUND rounds of kai-ray's decisions), with
no `expect` yet. Reading it back with `scenario.snapshot_of` gives the same snapshot (creation
times become `age_s`); fields a fuzzer snapshot never sets (selectors, tolerations, sub-groups)
are refused rather than dropped.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from kai_ray.core.model import Job, Node, Pod, Queue, Request, ResourceQuota, Snapshot
from kai_ray.sim import scenario


def case_of(snap: Snapshot, case_id: str, run: str = "full_cycle") -> dict[str, Any]:
    """`snap` as a scenario case (a mapping ready for YAML)."""
    return {"id": case_id, "run": run, "rounds": 1,
            "nodes": [_node(n) for n in snap.nodes],
            "queues": [_queue(q) for q in snap.queues],
            "jobs": [_job(j) for j in snap.jobs],
            "expect": {}}


def _node(n: Node) -> dict[str, Any]:
    if n.labels or n.taints or not n.ready or n.unschedulable or n.foreign_pods \
            or n.foreign_cpu_m or n.foreign_memory or n.foreign_gpus:
        raise ValueError(f"node {n.name}: labels, taints, readiness or foreign pods are not "
                         "written by this converter")
    return {"name": n.name, "gpus": n.gpus, "cpu_m": n.cpu_m, "memory_bytes": n.memory,
            "gpu_memory_mib": n.gpu_memory_mib, "pods": n.max_pods,
            **({} if n.gpu_memory_synced else {"gpu_memory_synced": False})}


def _quota(q: ResourceQuota) -> dict[str, float]:
    return {"quota": q.quota, "limit": q.limit, "weight": q.weight}


def _queue(q: Queue) -> dict[str, Any]:
    out: dict[str, Any] = {"name": q.name}
    if q.parent is not None:
        out["parent"] = q.parent
    if q.priority != 100:
        out["priority"] = q.priority
    for key in ("gpu", "cpu", "memory"):
        out[key] = _quota(getattr(q, key))
    out["age_s"] = scenario.NOW - q.created
    for key in ("display_name", "preempt_min_runtime_s", "reclaim_min_runtime_s"):
        if getattr(q, key) is not None:
            out[key] = getattr(q, key)
    return out


def _request(r: Request) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu_m": r.cpu_m, "memory_bytes": r.memory}
    if r.gpus:
        out["gpu"] = r.gpus
    if r.gpu_fraction_milli:
        out["gpu_fraction"] = r.gpu_fraction_milli / 1000
    if r.gpu_memory_mib:
        out["gpu_memory_mib"] = r.gpu_memory_mib
    if r.fraction_devices != 1:
        out["gpu_fraction_num_devices"] = r.fraction_devices
    return out


def _task(p: Pod, job: Job, base: Request) -> dict[str, Any]:
    if p.node_selector or p.tolerations or p.node_affinity is not None or p.subgroup \
            or p.namespace != job.namespace:
        raise ValueError(f"pod {p.name}: selectors, tolerations, affinity, sub-groups or "
                         "another namespace are not written by this converter")
    out: dict[str, Any] = {"name": p.name, "state": p.status.value}
    if p.node is not None:
        out["node"] = p.node
    if len(p.gpu_groups) == 1:
        out["device"] = p.gpu_groups[0]
    elif p.gpu_groups:
        out["devices"] = list(p.gpu_groups)
    if p.request != base:
        out.update(_request(p.request))
    if p.task_priority is not None:
        out["task_priority"] = p.task_priority
    if p.is_ray_head:
        out["ray_head"] = True
    if p.created != job.created:
        out["age_s"] = scenario.NOW - p.created
    return out


def _job(j: Job) -> dict[str, Any]:
    if j.subgroups:
        raise ValueError(f"job {j.name}: sub-groups are not written by this converter")
    base = j.pods[0].request if j.pods else Request()
    out: dict[str, Any] = {"name": j.name, "queue": j.queue, "priority": j.priority,
                           "min_member": j.min_member, "per_task": _request(base),
                           "tasks": [_task(p, j, base) for p in j.pods],
                           "age_s": scenario.NOW - j.created}
    if j.namespace != "default":
        out["namespace"] = j.namespace
    if j.preemptible is not None:
        out["preemptible"] = j.preemptible
    if j.stale_since is not None:
        out["stale_since_s"] = scenario.NOW - j.stale_since
    if j.last_start is not None:
        out["last_start_age_s"] = scenario.NOW - j.last_start
    return out


class _Flow(yaml.SafeDumper):
    """Mappings and lists of scalars on one line, as the scenario files are written."""


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flat = all(not isinstance(v, (dict, list)) or _scalars(v) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(),
                                    flow_style=flat or None)


def _scalars(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    return all(not isinstance(v, (dict, list)) for v in items)


_Flow.add_representer(dict, _represent_dict)


def dump(case: dict[str, Any]) -> str:
    """`case` as YAML for a scenario file's list (jobs and nodes one per line)."""
    text: str = yaml.dump([case], Dumper=_Flow, sort_keys=False, width=200)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    from kai_ray.core.model import SchedulerConfig
    from kai_ray.core.schedule import schedule
    from kai_ray.testing import kai_fuzz

    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.snapshot_case",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("seed", type=int)
    parser.add_argument("round", type=int, help="rounds of kai-ray's decisions applied first")
    parser.add_argument("--id", help="the case's id (default fuzz-SEED-ROUND)")
    parser.add_argument("--run", default="full_cycle", choices=list(scenario.RunKind.__args__))
    args = parser.parse_args(argv)
    snap = kai_fuzz.random_snapshot(args.seed)
    for r in range(args.round):
        ours = kai_fuzz.our_decisions(snap, schedule(snap, SchedulerConfig(), now=0.0))
        snap = kai_fuzz.arrivals(kai_fuzz.next_snapshot(snap, ours), args.seed, r)
    case = case_of(snap, args.id or f"fuzz-{args.seed}-{args.round}", args.run)
    case["source"] = {"fuzzer": f"python3 -m kai_ray.testing.kai_fuzz --show {args.seed} "
                                f"--rounds {args.round + 1} (round {args.round})"}
    sys.stdout.write(dump(case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
