"""The everyday tools: `kai-ray queues`, `kai-ray explain`, `kai-ray snapshot`.

All three read the live cluster once through the scheduler's own watch cache and snapshot
conversion (`ClusterCache.snapshot()`), then run the real core on that snapshot, so what they
print is what the scheduler computes, not a re-implementation:

- queues: fair shares and the pre-cycle allocation come from `schedule()` with no actions (the
  session's fair-share pass), pending demand is the requested amount not yet allocated;
- explain: one full cycle of `schedule()` on the snapshot gives the job's reason and message, the
  per-predicate node counts and the quota arithmetic, to which the live status (the PodGroup's
  scheduling condition, the pod's PodScheduled condition) is added;
- snapshot: the same snapshot written as a scenario file (docs/scenario-format.md plus the
  optional live fields of kai_ray/sim/scenario.py) that `kai-ray simulate` replays.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kai_ray import api_names
from kai_ray.core.constraints import Requirement
from kai_ray.core.model import (
    ACTIVE_USED,
    Job,
    PodStatus,
    Request,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.result import CycleResult, QueueShare
from kai_ray.core.schedule import schedule
from kai_ray.k8s import config_file, convert
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.client import api_client

Obj = dict[str, Any]
_RESOURCES = ("cpu", "memory", "gpu")  # QueueShare tuple order

# --------------------------------------------------------------------------------- live state
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
    for informer in cache.informers:
        informer._list()
    snapshot, problems, podgroups = cache.snapshot()
    pods = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": p
            for p in cache.pods.values()}
    queues = {q["metadata"]["name"]: q for q in cache.queues.values()}
    return Live(snapshot, problems, podgroups, pods, queues, time.time())


def scheduler_config(path: str | None) -> SchedulerConfig:
    """The scheduler's YAML configuration (the chart's ConfigMap, `kai-ray run --config`)."""
    return config_file.read(path)[0]


def _fmt(value: float, unlimited: bool = True) -> str:
    if unlimited and value == -1:
        return "-"
    return f"{round(value, 3):g}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- queues
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
        for r, res in enumerate(_RESOURCES):
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
    table = []
    for row in rows:
        g, c, m = row["gpu"], row["cpu"], row["memory"]
        table.append([
            "  " * row["depth"] + row["name"], str(row["priority"]),
            _fmt(g["quota"]), _fmt(g["limit"]), _fmt(g["weight"], False),
            _fmt(g["allocated"], False), _fmt(g["fair_share"], False),
            _fmt(g["pending"], False),
            f"{_fmt(c['allocated'], False)}/{_fmt(c['fair_share'], False)}",
            f"{_fmt(m['allocated'], False)}/{_fmt(m['fair_share'], False)}",
        ])
    out = [_table(["QUEUE", "PRIO", "GPU QUOTA", "LIMIT", "WEIGHT", "ALLOCATED", "FAIR SHARE",
                   "PENDING", "CPU ALLOC/FAIR", "MEM GB ALLOC/FAIR"], table)]
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


# ------------------------------------------------------------------------------------ explain
def _job_request(pods: Iterable[Request]) -> dict[str, float]:
    cpu = mem = gpu = 0.0
    for r in pods:
        cpu += r.cpu_m / 1000
        mem += r.memory / 1e9
        if r.gpus:
            gpu += r.gpus
        elif r.gpu_fraction_milli:
            gpu += r.gpu_fraction_milli / 1000 * r.fraction_devices
    return {"cpu": cpu, "memory": mem, "gpu": gpu}


def node_gpu_free(snapshot: Snapshot) -> dict[str, int]:
    """Whole GPUs free on each schedulable node (a shared device counts as used, as in KAI)."""
    used: dict[str, int] = {}
    shared: dict[str, set[str]] = {}
    for job in snapshot.jobs:
        for pod in job.pods:
            if pod.status not in ACTIVE_USED or not pod.node:
                continue
            if pod.request.gpus:
                used[pod.node] = used.get(pod.node, 0) + pod.request.gpus
            elif pod.request.is_shared:
                shared.setdefault(pod.node, set()).update(pod.gpu_groups)
    return {n.name: n.gpus - n.foreign_gpus - used.get(n.name, 0) - len(shared.get(n.name, ()))
            for n in snapshot.nodes if n.ready and not n.unschedulable}


def _path(shares: Mapping[str, QueueShare], queue: str) -> list[QueueShare]:
    out = []
    q = shares.get(queue)
    while q is not None:
        out.append(q)
        q = shares.get(q.parent) if q.parent else None
    return out


def _leaves(shares: Mapping[str, QueueShare]) -> list[str]:
    parents = {q.parent for q in shares.values() if q.parent}
    return sorted(n for n in shares if n not in parents)


def _queue_numbers(shares: Mapping[str, QueueShare], queue: str) -> list[dict[str, Any]]:
    out = []
    for q in _path(shares, queue):
        entry: dict[str, Any] = {"queue": q.name}
        for r, res in enumerate(_RESOURCES):
            scale = {"cpu": 1000.0, "memory": 1e9, "gpu": 1.0}[res]

            def unit(v: float, s: float = scale) -> float:
                return v if v == -1 else v / s

            entry[res] = {"quota": unit(q.deserved[r]), "limit": unit(q.limit[r]),
                          "allocated": unit(q.allocated[r]),
                          "allocated_non_preemptible": unit(q.allocated_non_preemptible[r]),
                          "fair_share": unit(q.fair_share[r])}
        out.append(entry)
    return out


_UNIT = {"gpu": "GPUs", "cpu": "CPU cores", "memory": "GB memory"}


def _capacity_changes(reason: str, numbers: list[dict[str, Any]], request: dict[str, float],
                      ) -> list[str]:
    """What would let the job in, from the quota arithmetic of every queue on its path."""
    out = []
    for entry in numbers:
        for res in ("gpu", "cpu", "memory"):
            need = request[res]
            n = entry[res]
            if need <= 0:
                continue
            if reason == "OverLimit" and n["limit"] != -1 and \
                    n["allocated"] + need > n["limit"] + 1e-9:
                missing = n["allocated"] + need - n["limit"]
                out.append(
                    f"queue {entry['queue']}: {res} limit {_fmt(n['limit'])} < allocated "
                    f"{_fmt(n['allocated'])} + requested {_fmt(need)}: raise the limit to at "
                    f"least {_fmt(n['allocated'] + need)} {_UNIT[res]}, or wait until "
                    f"{_fmt(missing)} {_UNIT[res]} of the queue are released")
            if reason == "NonPreemptibleOverQuota" and n["quota"] != -1 and \
                    n["allocated_non_preemptible"] + need > n["quota"] + 1e-9:
                out.append(
                    f"queue {entry['queue']}: non-preemptible {res} allocated "
                    f"{_fmt(n['allocated_non_preemptible'])} + requested {_fmt(need)} > quota "
                    f"{_fmt(n['quota'])}: raise the quota to at least "
                    f"{_fmt(n['allocated_non_preemptible'] + need)} {_UNIT[res]}, or make the "
                    "workload preemptible (priorityClassName train or build-preemptible, or "
                    "PodGroup spec.preemptibility: preemptible) to run over quota")
    return out


def _node_changes(snapshot: Snapshot, job: Job, pending: list[str]) -> tuple[dict[str, Any],
                                                                            list[str]]:
    """GPU arithmetic over nodes for a job that no node set fits."""
    free = node_gpu_free(snapshot)
    by_name = {p.name: p for p in job.pods}
    per_pod = max((by_name[n].request.gpus for n in pending if n in by_name), default=0)
    wanted = sum(by_name[n].request.gpus for n in pending if n in by_name)
    selectors = {by_name[n].node_selector for n in pending if n in by_name}
    eligible = free
    if len(selectors) == 1 and next(iter(selectors)):
        sel = dict(next(iter(selectors)))
        labels = {n.name: dict(n.labels) for n in snapshot.nodes}
        eligible = {n: f for n, f in free.items()
                    if all(labels[n].get(k) == v for k, v in sel.items())}
    facts: dict[str, Any] = {"schedulable_nodes": len(free),
                             "nodes_matching_selector": len(eligible),
                             "gpus_per_pod": per_pod, "pending_pods": len(pending),
                             "gpus_pending": wanted}
    changes: list[str] = []
    if per_pod:
        fitting = sorted(n for n, f in eligible.items() if f >= per_pod)
        # the node with the most free GPUs, the first by name among equals
        best = max(sorted(eligible.items()), key=lambda kv: kv[1], default=(None, 0))
        facts.update(nodes_with_enough_free_gpus=len(fitting), most_free_gpus=best[1],
                     most_free_node=best[0], free_gpus_total=sum(max(0, f)
                                                                 for f in eligible.values()))
        slots = sum(max(0, f) // per_pod for f in eligible.values())
        facts["pods_that_fit_now"] = slots
        if slots < len(pending):
            changes.append(
                f"each pod needs {per_pod} GPU(s) on one node; {len(fitting)} of "
                f"{len(eligible)} eligible node(s) have that many free (most free: "
                f"{best[1]} on {best[0]}); room for {slots} of the {len(pending)} pending "
                f"pod(s): free GPUs on those nodes, add nodes with at least {per_pod} free "
                "GPUs, or lower the per-pod GPU request")
    return facts, changes


def explain(live: Live, config: SchedulerConfig, namespace: str, target: str) -> dict[str, Any]:
    """Why the pod or PodGroup `target` (POD, pod/NAME, podgroup/NAME, pg/NAME) is pending."""
    kind, _, name = target.rpartition("/")
    if not kind:  # a bare name: the pod, else the PodGroup of that name
        pod_exists = f"{namespace}/{name}" in live.pods
        kind = "pod" if pod_exists or convert.job_key(namespace, name) not in live.podgroups \
            else "podgroup"
    kind = kind.lower()
    if kind not in ("pod", "pods", "po", "podgroup", "podgroups", "pg"):
        raise SystemExit(f"kai-ray explain: {target!r}: expected POD, pod/NAME or podgroup/NAME")
    out: dict[str, Any] = {"target": f"{kind}/{name}", "namespace": namespace}
    pod: Obj | None = None
    group: str | None
    if kind.startswith("po") and kind != "podgroup":
        pod = live.pods.get(f"{namespace}/{name}")
        if pod is None:
            out.update(found=False, summary=f"pod {namespace}/{name} not found")
            return out
        spec = pod.get("spec") or {}
        if not convert.is_ours(pod):
            out.update(found=True, summary=f"pod {namespace}/{name} has schedulerName "
                       f"{spec.get('schedulerName', 'default-scheduler')!r}, not "
                       f"{api_names.SCHEDULER_NAME!r}: kai-ray does not schedule it")
            return out
        if spec.get("nodeName"):
            out.update(found=True, scheduled=True,
                       summary=f"pod {namespace}/{name} is scheduled on node {spec['nodeName']}")
            return out
        group = ((pod.get("metadata") or {}).get("annotations") or {}).get(
            api_names.POD_GROUP_ANNOTATION)
        if not group:
            out.update(found=True, summary=(
                f"pod {namespace}/{name} has no {api_names.POD_GROUP_ANNOTATION!r} annotation "
                "yet: the pod grouper (kai-ray run) has not grouped it. Is the scheduler "
                "running? (kubectl get pods -l app.kubernetes.io/component=scheduler -A)"))
            return out
    else:
        group = name
    key = convert.job_key(namespace, group or "")
    job = next((j for j in live.snapshot.jobs if j.name == key), None)
    pg = live.podgroups.get(key)
    if job is None:
        bad = [str(p) for p in live.problems if p.kind == "PodGroup" and p.name == group]
        out.update(found=pod is not None, summary=(
            f"PodGroup {namespace}/{group} " + (f"is invalid: {bad[0]}" if bad else
                                               "not found")))
        return out
    out["podgroup"] = group
    out["queue"] = job.queue
    out["priority"] = job.priority
    out["preemptible"] = job.is_preemptible
    pending = [p.name for p in job.pods if p.status == PodStatus.PENDING]
    if pod is not None:
        pending = [name] if any(p.name == name for p in job.pods
                                if p.status == PodStatus.PENDING) else pending
    result = schedule(live.snapshot, config, live.taken)
    before = schedule(live.snapshot, dataclasses.replace(config, actions=()), live.taken)
    status = result.job_status.get(job.name)
    live_cond = _live_conditions(pg, pod)
    out["live"] = live_cond
    binds = [b for b in result.binds if b.job == job.name]
    if status is None:
        if binds:
            where = ", ".join(sorted({f"{b.pod} -> {b.node}" for b in binds}))
            out.update(found=True, reason="Schedulable", summary=(
                f"PodGroup {namespace}/{group} fits now: one cycle on the current snapshot "
                f"places {where}; the scheduler binds it within a cycle if it is running"))
        else:
            out.update(found=True, reason="NothingPending",
                       summary=f"PodGroup {namespace}/{group} has no pending pods")
        return out
    request = _job_request(p.request for p in job.pods if p.name in status.pending_pods)
    out.update(found=True, reason=status.reason, message=status.message,
               pending_pods=list(status.pending_pods),
               request={k: round(v, 3) for k, v in request.items()})
    changes: list[str] = []
    if status.reason in ("OverLimit", "NonPreemptibleOverQuota"):
        numbers = _queue_numbers(before.queues, job.queue)
        out["queues"] = numbers
        changes = _capacity_changes(status.reason, numbers, request)
    elif status.reason == "QueueDoesNotExist":
        leaves = _leaves(before.queues)
        changes = [f"create Queue {job.queue!r} (a leaf queue), or point the workload at an "
                   f"existing leaf queue with label kai.scheduler/queue (leaf queues: "
                   f"{', '.join(leaves) or 'none'})"]
    elif status.reason == "QueueParentCycle":
        changes = ["change one spec.parentQueue on the cycle the message names, so that the "
                   "chain of parents ends at a root queue (`kai-ray queues` lists the problem)"]
    elif status.reason == "QueueNotLeaf":
        kids = sorted(q.name for q in before.queues.values() if q.parent == job.queue)
        changes = [f"queue {job.queue!r} has child queues ({', '.join(kids)}); label the "
                   "workload with one of them"]
    elif status.reason == "NotReady":
        changes = ["create the missing pods (the gang's minMember counts pods that exist and "
                   "are not gated)"]
    if status.fit is not None:
        out["nodes_failed"] = {reason: count for reason, count in status.fit.reasons}
        facts, node_changes = _node_changes(live.snapshot, job, list(status.pending_pods))
        out["nodes"] = facts
        changes += node_changes
    out["what_would_have_to_change"] = changes
    out["summary"] = f"PodGroup {namespace}/{group} is pending: {status.reason}"
    return out


def _live_conditions(pg: Obj | None, pod: Obj | None) -> dict[str, Any]:
    live: dict[str, Any] = {}
    if pg is not None:
        conds = (pg.get("status") or {}).get("schedulingConditions") or []
        if conds:
            reasons = conds[-1].get("reasons") or []
            live["podgroup"] = {"reason": reasons[0].get("reason") if reasons else None,
                                "message": conds[-1].get("message")}
    if pod is not None:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                live["pod"] = {"reason": c.get("reason"), "message": c.get("message")}
    return live


def render_explain(doc: dict[str, Any]) -> str:
    lines = [doc.get("summary", "")]
    if doc.get("queue") is not None and doc.get("reason"):
        lines.append(f"  queue {doc['queue']}, priority {doc.get('priority')} "
                     f"({'preemptible' if doc.get('preemptible') else 'non-preemptible'})")
    if doc.get("message"):
        lines.append(f"  reason: {doc['reason']}")
        lines.append(f"  message: {doc['message']}")
    if doc.get("request"):
        r = doc["request"]
        lines.append(f"  pending pods: {len(doc.get('pending_pods', []))}, requesting "
                     f"{_fmt(r['gpu'], False)} GPUs, {_fmt(r['cpu'], False)} CPU cores, "
                     f"{_fmt(r['memory'], False)} GB memory")
    for q in doc.get("queues", []):
        g = q["gpu"]
        lines.append(f"  queue {q['queue']}: GPU quota {_fmt(g['quota'])}, limit "
                     f"{_fmt(g['limit'])}, allocated {_fmt(g['allocated'], False)} "
                     f"(non-preemptible {_fmt(g['allocated_non_preemptible'], False)}), "
                     f"fair share {_fmt(g['fair_share'], False)}")
    if doc.get("nodes_failed"):
        lines.append("  nodes that failed a predicate:")
        for reason, count in doc["nodes_failed"].items():
            lines.append(f"    {count} node(s) {reason}")
    if doc.get("nodes"):
        n = doc["nodes"]
        if "most_free_gpus" in n:
            lines.append(f"  GPUs: {n['gpus_per_pod']} per pod, {n['pending_pods']} pending "
                         f"pod(s); {n['nodes_with_enough_free_gpus']} of "
                         f"{n['nodes_matching_selector']} eligible node(s) have that many free; "
                         f"most free on one node: {n['most_free_gpus']} "
                         f"({n['most_free_node']})")
    if doc.get("what_would_have_to_change"):
        lines.append("  what would have to change:")
        lines.extend(f"    - {c}" for c in doc["what_would_have_to_change"])
    live = doc.get("live") or {}
    if "podgroup" in live:
        lines.append(f"  scheduler's last word on the PodGroup: {live['podgroup']['message']}")
    if "pod" in live:
        lines.append(f"  pod condition PodScheduled=False: {live['pod']['message']}")
    return "\n".join(line for line in lines if line)


def cmd_explain(args: argparse.Namespace) -> int:
    live = read_cluster(args.kubeconfig, getattr(args, "config", None))
    doc = explain(live, scheduler_config(getattr(args, "config", None)), args.namespace,
                  args.name)
    if args.output == "json":
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render_explain(doc))
    return 0 if doc.get("found") else 1


# ----------------------------------------------------------------------------------- snapshot
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
    """The snapshot as one scenario (run: full_cycle, one round) for `kai-ray simulate`."""
    nodes = []
    for n in sorted(snapshot.nodes, key=lambda n: n.name):
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
    for q in sorted(snapshot.queues, key=lambda q: (q.created, q.name)):
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
    for j in sorted(snapshot.jobs, key=lambda j: (j.created, j.name)):
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


def predicted(result: CycleResult) -> dict[str, Any]:
    """What one cycle decides for pending pods: binds and pending reasons (for comparisons)."""
    return {"binds": {f"{b.namespace}/{b.pod}": b.node for b in result.binds},
            "pending": {s.job: s.reason for s in result.job_status.values()}}


def cmd_snapshot(args: argparse.Namespace) -> int:
    live = read_cluster(args.kubeconfig, getattr(args, "config", None))
    config = scheduler_config(getattr(args, "config", None))
    for p in live.problems:
        print(f"kai-ray snapshot: left out: {p}", file=sys.stderr)
    doc = {"x-kai-ray-snapshot": {"problems": [str(p) for p in live.problems]},
           "scenarios": [scenario_of(live.snapshot, config, live.taken)]}
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    if args.file in ("-", None):
        sys.stdout.write(text)
    else:
        Path(args.file).write_text(text)
        counts = (len(live.snapshot.nodes), len(live.snapshot.queues), len(live.snapshot.jobs))
        print(f"wrote {args.file}: {counts[0]} nodes, {counts[1]} queues, {counts[2]} jobs",
              file=sys.stderr)
    return 0

