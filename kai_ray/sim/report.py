"""Readable placement reports: nodes and devices with who sits on them, queue shares, and why
anything is pending. Also the JSON form for scripts."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from kai_ray.core.model import Snapshot
from kai_ray.core.result import CycleResult
from kai_ray.sim.runner import Outcome
from kai_ray.sim.scenario import Scenario, snapshot_of

_GONE = ("Pending", "Releasing", "Pipelined", "Failed", "Succeeded")


def _gpu_share(pod_request: Any, gpu_memory: int) -> float:
    if pod_request.gpu_fraction_milli:
        return float(pod_request.gpu_fraction_milli) / 1000
    return float(pod_request.gpu_memory_mib) / gpu_memory


def render_nodes(snapshot: Snapshot, outcome: Outcome) -> list[str]:
    nodes = {n.name: n for n in snapshot.nodes}
    whole: dict[str, list[str]] = defaultdict(list)
    devices: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    cpu_only: dict[str, list[str]] = defaultdict(list)
    for job in snapshot.jobs:
        for pod in job.pods:
            o = outcome.pods.get(pod.name)
            if o is None or o.node is None or o.status in _GONE:
                continue
            r = pod.request
            if r.gpus:
                whole[o.node].append(f"{pod.name} ({r.gpus} GPU)")
            elif r.is_shared:
                for g in o.gpu_groups:
                    devices[(o.node, g)].append(
                        (pod.name, _gpu_share(r, nodes[o.node].gpu_memory_mib)))
            else:
                cpu_only[o.node].append(pod.name)
    lines = ["Nodes"]
    for name, node in nodes.items():
        shared = [(g, pods) for (n, g), pods in sorted(devices.items()) if n == name]
        used = sum(int(p.split("(")[1].split()[0]) for p in whole[name]) + len(shared)
        lines.append(f"  {name:<14} GPUs {used}/{node.gpus} used"
                     + (f", {len(shared)} shared" if shared else ""))
        for gid, pods in shared:
            total = sum(share for _, share in pods)
            who = ", ".join(f"{p} {share:g}" for p, share in pods)
            lines.append(f"    shared device {gid:<16} {total:4.2f} of 1  <- {who}")
        if whole[name]:
            lines.append(f"    whole GPUs: {', '.join(whole[name])}")
        if cpu_only[name]:
            lines.append(f"    CPU-only:   {', '.join(cpu_only[name])}")
    return lines


def _fmt(v: float) -> str:
    return "unlimited" if v == -1 else f"{v:g}"


def render_queues(outcome: Outcome) -> list[str]:
    if outcome.result is None:
        return []
    lines = ["Queues (GPUs)", f"  {'queue':<16}{'allocated':>10}{'fair share':>12}{'quota':>11}"
             f"{'limit':>11}{'requested':>11}"]
    for q in outcome.result.queues.values():
        label = ("  " + q.name) if q.parent else q.name
        lines.append(f"  {label:<16}{q.allocated[2]:>10g}{q.fair_share[2]:>12g}"
                     f"{_fmt(q.deserved[2]):>11}{_fmt(q.limit[2]):>11}{q.requested[2]:>11g}")
    return lines


def render_decisions(outcome: Outcome) -> list[str]:
    lines = []
    for i, result in enumerate(outcome.rounds):
        decisions = _decisions(result)
        if decisions:
            title = f"Cycle {i + 1}" if len(outcome.rounds) > 1 else "Decisions"
            lines.append(title)
            lines.extend(decisions)
    return lines


def _decisions(result: CycleResult) -> list[str]:
    lines = []
    for b in result.binds:
        extra = f" on shared device {', '.join(b.gpu_groups)} ({b.gpu_portion:.2f})" \
            if b.gpu_groups else ""
        lines.append(f"  bind      {b.pod} -> {b.node}{extra}")
    for p in result.pipelined:
        lines.append(f"  pipeline  {p.pod} -> {p.node} (waits for resources being released)")
    for e in result.evictions:
        lines.append(f"  evict     {e.pod} ({e.action}): {e.message.splitlines()[0]}")
    return lines


def render_pending(outcome: Outcome) -> list[str]:
    if outcome.result is None or not outcome.result.job_status:
        return []
    lines = ["Pending"]
    for status in outcome.result.job_status.values():
        lines.append(f"  {status.job}: {status.reason}: {status.message}")
    return lines


def render_text(scenario: Scenario, outcome: Outcome) -> str:
    if scenario.run == "fairshare_only":
        shares = ", ".join(f"{k}={v:g}" for k, v in outcome.fair_share.items())
        return f"== {scenario.id}: {scenario.title}\nfair share: {shares}; " \
               f"unassigned {outcome.unassigned:g}"
    snapshot = snapshot_of(scenario)
    parts = [f"== {scenario.id}: {scenario.title}"]
    for block in (render_nodes(snapshot, outcome), render_queues(outcome),
                  render_decisions(outcome), render_pending(outcome)):
        if block:
            parts.append("\n".join(block))
    return "\n".join(parts)


def as_json(scenario: Scenario, outcome: Outcome) -> dict[str, Any]:
    result = outcome.result
    out: dict[str, Any] = {"id": scenario.id, "title": scenario.title}
    if result is None:
        out.update(fair_share=outcome.fair_share, unassigned=outcome.unassigned)
        return out
    out["pods"] = {name: {"status": o.status, "node": o.node, "devices": list(o.gpu_groups)}
                   for name, o in outcome.pods.items()}
    out["binds"] = [vars_of(b) for b in result.binds]
    out["pipelined"] = [vars_of(p) for p in result.pipelined]
    out["evictions"] = [vars_of(e) for e in result.evictions]
    out["pending"] = {k: {"reason": v.reason, "message": v.message,
                          "pods": list(v.pending_pods)} for k, v in result.job_status.items()}
    out["queues"] = {k: {"allocated": q.allocated, "fair_share": q.fair_share,
                         "quota": q.deserved, "limit": q.limit, "requested": q.requested}
                     for k, q in result.queues.items()}
    return out


def vars_of(obj: Any) -> dict[str, Any]:
    # by the dataclass fields (the result classes have no instance __dict__ to read)
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
