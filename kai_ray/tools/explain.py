"""`kai-ray explain`: why a job or pod waits.

One full cycle of `schedule()` on the live snapshot gives the job's reason and message, the
per-predicate node counts and the quota arithmetic, to which the live status (the PodGroup's
scheduling condition, the pod's PodScheduled condition) is added.
"""


from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kai_ray import api_names
from kai_ray.core.model import (
    ACTIVE_USED,
    Job,
    PodStatus,
    Request,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.result import QueueShare
from kai_ray.core.schedule import schedule
from kai_ray.k8s import convert
from kai_ray.tools.live import RESOURCES, Live, Obj, fmt, read_cluster, scheduler_config


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
        for r, res in enumerate(RESOURCES):
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
                    f"queue {entry['queue']}: {res} limit {fmt(n['limit'])} < allocated "
                    f"{fmt(n['allocated'])} + requested {fmt(need)}: raise the limit to at "
                    f"least {fmt(n['allocated'] + need)} {_UNIT[res]}, or wait until "
                    f"{fmt(missing)} {_UNIT[res]} of the queue are released")
            if reason == "NonPreemptibleOverQuota" and n["quota"] != -1 and \
                    n["allocated_non_preemptible"] + need > n["quota"] + 1e-9:
                out.append(
                    f"queue {entry['queue']}: non-preemptible {res} allocated "
                    f"{fmt(n['allocated_non_preemptible'])} + requested {fmt(need)} > quota "
                    f"{fmt(n['quota'])}: raise the quota to at least "
                    f"{fmt(n['allocated_non_preemptible'] + need)} {_UNIT[res]}, or make the "
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
                     f"{fmt(r['gpu'], False)} GPUs, {fmt(r['cpu'], False)} CPU cores, "
                     f"{fmt(r['memory'], False)} GB memory")
    for q in doc.get("queues", []):
        g = q["gpu"]
        lines.append(f"  queue {q['queue']}: GPU quota {fmt(g['quota'])}, limit "
                     f"{fmt(g['limit'])}, allocated {fmt(g['allocated'], False)} "
                     f"(non-preemptible {fmt(g['allocated_non_preemptible'], False)}), "
                     f"fair share {fmt(g['fair_share'], False)}")
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


