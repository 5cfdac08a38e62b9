"""A Snapshot written as a scenario case (docs/scenario-format.md plus the optional live fields
of kai_ray/sim/scenario.py): what `kai-ray snapshot` saves of a live cluster and what
`python3 -m kai_ray.testing.snapshot_case` prints of a fuzzer round. Reading it back with
`scenario.snapshot_of` at the same `now` gives the snapshot again."""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kai_ray.core.constraints import Requirement
from kai_ray.core.model import ACTIVE_USED, PodStatus, Request, SchedulerConfig, Snapshot


def _task(pod: Any, now: float) -> dict[str, Any]:
    r: Request = pod.request
    state = {PodStatus.BOUND: "Bound", PodStatus.GATED: "Gated"}.get(pod.status,
                                                                       pod.status.value)
    if state == "Allocated":
        state = "Binding"
    task: dict[str, Any] = {"name": pod.name, "state": state, "cpu_m": r.cpu_m,
                            "memory_bytes": r.memory, "age_s": round(now - pod.created, 3)}
    if r.gpus:
        task["gpu"] = r.gpus
    if r.gpu_fraction_milli:
        task["gpu_fraction"] = r.gpu_fraction_milli / 1000
    if r.gpu_memory_mib:
        task["gpu_memory_mib"] = r.gpu_memory_mib
    if r.is_shared and r.fraction_devices != 1:
        task["gpu_fraction_num_devices"] = r.fraction_devices
    if pod.node and pod.status in (*ACTIVE_USED, PodStatus.BOUND, PodStatus.BINDING):
        task["node"] = pod.node
        if pod.gpu_groups:
            if len(pod.gpu_groups) == 1:
                task["device"] = pod.gpu_groups[0]
            else:
                task["devices"] = list(pod.gpu_groups)
    elif pod.node and state not in ("Pending", "Gated", "Failed"):
        task["node"] = pod.node
    if pod.task_priority is not None:
        task["task_priority"] = pod.task_priority
    if pod.subgroup:
        task["subgroup"] = pod.subgroup
    if pod.node_selector:
        task["node_selector"] = dict(pod.node_selector)
    if pod.tolerations:
        task["tolerations"] = [{"key": t.key, "operator": t.operator, "value": t.value,
                                "effect": t.effect} for t in pod.tolerations]
    if pod.node_affinity is not None:
        task["node_affinity"] = [
            {"match_expressions": [_requirement(r) for r in term if not r.field],
             "match_fields": [_requirement(r) for r in term if r.field]}
            for term in pod.node_affinity]
    if pod.is_ray_head:
        task["ray_head"] = True
    return task


def _requirement(r: Requirement) -> dict[str, Any]:
    return {"key": r.key, "operator": r.operator, "values": list(r.values)}


def _quota(q: Any) -> dict[str, float]:
    return {"quota": q.quota, "limit": q.limit, "weight": q.weight}


def scenario_of(snapshot: Snapshot, config: SchedulerConfig, now: float,
                title: str = "live cluster") -> dict[str, Any]:
    """The snapshot as one scenario (run: full_cycle, one round) for `kai-ray simulate`, its
    nodes, queues and jobs in the snapshot's order (`in_file_order` sorts a live one)."""
    nodes = []
    for n in snapshot.nodes:
        node: dict[str, Any] = {"name": n.name, "gpus": n.gpus, "cpu_m": n.cpu_m,
                                "memory_bytes": n.memory, "gpu_memory_mib": n.gpu_memory_mib,
                                "pods": n.max_pods}
        if n.labels:
            node["labels"] = dict(n.labels)
        if not n.ready:
            node["ready"] = False
        if n.unschedulable:
            node["unschedulable"] = True
        if n.taints:
            node["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect}
                              for t in n.taints]
        if not n.gpu_memory_synced:
            node["gpu_memory_synced"] = False
        if n.foreign_cpu_m or n.foreign_memory or n.foreign_gpus or n.foreign_pods:
            node["foreign"] = {"cpu_m": n.foreign_cpu_m, "memory_bytes": n.foreign_memory,
                               "gpus": n.foreign_gpus, "pods": n.foreign_pods}
        nodes.append(node)
    queues = []
    for q in snapshot.queues:
        queue: dict[str, Any] = {"name": q.name, "priority": q.priority, "gpu": _quota(q.gpu),
                                 "cpu": _quota(q.cpu), "memory": _quota(q.memory),
                                 "age_s": round(now - q.created, 3)}
        if q.parent:
            queue["parent"] = q.parent
        if q.display_name:
            queue["display_name"] = q.display_name
        if q.preempt_min_runtime_s is not None:
            queue["preempt_min_runtime_s"] = q.preempt_min_runtime_s
        if q.reclaim_min_runtime_s is not None:
            queue["reclaim_min_runtime_s"] = q.reclaim_min_runtime_s
        queues.append(queue)
    jobs = []
    for j in snapshot.jobs:
        job: dict[str, Any] = {"name": j.name, "namespace": j.namespace, "queue": j.queue,
                               "priority": j.priority, "min_member": j.min_member,
                               "age_s": round(now - j.created, 3),
                               "tasks": [_task(p, now) for p in j.pods]}
        if j.preemptible is not None:
            job["preemptible"] = j.preemptible
        if j.subgroups:
            job["subgroups"] = [{"name": s.name, "min_member": s.min_member}
                                for s in j.subgroups]
        if j.stale_since is not None:
            job["stale_since_s"] = round(now - j.stale_since, 3)
        if j.last_start is not None:
            job["last_start_age_s"] = round(now - j.last_start, 3)
        if not job["tasks"]:
            continue  # a PodGroup whose pods are gone: nothing to schedule
        jobs.append(job)
    taken = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "id": "live-snapshot",
        "title": f"{title} at {taken}",
        "source": {"tool": "kai-ray snapshot", "taken": taken},
        "run": "full_cycle",
        "rounds": 1,
        "config": {
            "plugins_only": [{"name": "nodeplacement",
                              "args": {"gpu": config.placement.gpu,
                                       "cpu": config.placement.cpu}}],
            "staleness_grace_period_s": config.staleness_grace_period_s,
            "actions": list(config.actions),
            "max_consolidation_preemptees": config.max_consolidation_preemptees,
            "gpu_packing": config.gpu_packing,
        },
        "nodes": nodes,
        "queues": queues,
        "jobs": jobs,
        "expect": {},
    }


def in_file_order(snapshot: Snapshot) -> Snapshot:
    """Nodes by name, queues and jobs by creation: a live cluster's lists come in whatever
    order the API served them, and a saved file should not change with it."""
    return replace(snapshot, nodes=tuple(sorted(snapshot.nodes, key=lambda n: n.name)),
                   queues=tuple(sorted(snapshot.queues, key=lambda q: (q.created, q.name))),
                   jobs=tuple(sorted(snapshot.jobs, key=lambda j: (j.created, j.name))))
