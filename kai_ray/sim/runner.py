"""Run scenarios through the real core and check their expectations (docs/scenario-format.md)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from kai_ray.core import fairshare
from kai_ray.core.model import PodStatus, SchedulerConfig, Snapshot
from kai_ray.core.result import CycleResult, PodOutcome
from kai_ray.core.schedule import schedule
from kai_ray.sim.scenario import NOW, Scenario, ScenarioError, config_of, snapshot_of

EXTRA_ROUNDS = 5
CYCLE_SECONDS = 1.0


@dataclass
class Outcome:
    pods: dict[str, PodOutcome]
    result: CycleResult | None
    history: list[dict[str, PodOutcome]] = field(default_factory=list)
    rounds: list[CycleResult] = field(default_factory=list)
    schedule_seconds: float = 0.0  # wall time inside schedule() (snapshot compile + actions)
    fair_share: dict[str, float] = field(default_factory=dict)
    unassigned: float = 0.0


def _timed(snapshot: Snapshot, config: SchedulerConfig, now: float, clock: list[float]
           ) -> CycleResult:
    start = time.perf_counter()
    result = schedule(snapshot, config, now)
    clock[0] += time.perf_counter() - start
    return result


def run(scenario: Scenario) -> Outcome:
    if scenario.run == "fairshare_only":
        return _fairshare_only(scenario)
    config = config_of(scenario)
    snapshot = snapshot_of(scenario)
    if scenario.run != "full_cycle":
        config = dataclasses.replace(config, actions=(scenario.run,))
        clock = [0.0]
        result = _timed(snapshot, config, NOW, clock)
        return Outcome(dict(result.pods), result, rounds=[result], schedule_seconds=clock[0])
    now = NOW
    rounds = []
    clock = [0.0]
    for _ in range(scenario.rounds):
        rounds.append(_timed(snapshot, config, now, clock))
        snapshot = advance(snapshot, rounds[-1])
        now += CYCLE_SECONDS
    result = rounds[-1]
    outcome = Outcome({name: _settled(o) for name, o in result.pods.items()}, result,
                      rounds=rounds, schedule_seconds=clock[0])
    for _ in range(EXTRA_ROUNDS):
        extra = schedule(snapshot, config, now)
        outcome.history.append(dict(extra.pods))
        snapshot = advance(snapshot, extra)
        now += CYCLE_SECONDS
    return outcome


def _settled(o: PodOutcome) -> PodOutcome:
    """What a pod looks like once the round's decisions have been carried out."""
    if o.status == "Binding":
        return PodOutcome("Running", o.node, o.gpu_groups)
    if o.status in ("Pipelined", "Releasing"):
        return PodOutcome("Pending", None, ())
    return o


def advance(snapshot: Snapshot, result: CycleResult) -> Snapshot:
    """Carry a round's decisions out: binds run, pipelined and evicted pods become pending."""
    jobs = []
    for job in snapshot.jobs:
        pods = []
        for pod in job.pods:
            o = _settled(result.pods.get(pod.name, PodOutcome(pod.status.value, pod.node,
                                                              pod.gpu_groups)))
            pods.append(dataclasses.replace(pod, status=PodStatus(o.status), node=o.node,
                                            gpu_groups=o.gpu_groups))
        stale = job.stale_since
        if job.name in result.stale_set:
            stale = result.stale_set[job.name]
        if job.name in result.stale_cleared:
            stale = None
        jobs.append(dataclasses.replace(job, pods=tuple(pods), stale_since=stale))
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


def _fairshare_only(scenario: Scenario) -> Outcome:
    if scenario.total_gpus is None:
        raise ScenarioError(f"scenario {scenario.id}: fairshare_only needs total_gpus")
    inputs = []
    for i, q in enumerate(scenario.fairshare_specs()):
        inputs.append(fairshare.ShareInput(
            name=q.name, deserved=q.deserved, limit=-1.0 if q.limit is None else q.limit,
            weight=q.weight, request=q.request, priority=q.priority or 100, created=i * 60.0))
    unassigned = fairshare.divide(scenario.total_gpus, inputs)
    return Outcome({}, None, fair_share={q.name: q.fair_share for q in inputs},
                   unassigned=unassigned)


# ---------------------------------------------------------------------------- expectations


def check(scenario: Scenario, outcome: Outcome) -> list[str]:
    """Human-readable mismatches; empty when the scenario passes."""
    if scenario.run == "fairshare_only":
        return _check_fairshare(scenario, outcome)
    failures: list[str] = []
    initial_groups = {g for job in scenario.jobs for t in job.tasks if t.device for g in [t.device]}
    job_pods = {job.name: [t.name or f"{job.name}-{i}" for i, t in enumerate(job.tasks)]
                for job in scenario.jobs}
    for target, raw in scenario.expect.items():
        if not isinstance(raw, dict):
            failures.append(f"{target}: expectation must be a mapping")
            continue
        unknown = set(raw) - {"status", "node", "device", "reason", "accepted_gpu_portion"}
        if unknown:
            failures.append(f"{target}: unsupported expectation field(s) {sorted(unknown)}")
            continue
        pods = job_pods.get(target) or ([target] if target in outcome.pods else [])
        if not pods:
            failures.append(f"{target}: no such job or pod")
            continue
        for pod in pods:
            failures.extend(_check_pod(scenario, outcome, pod, raw, initial_groups, job_pods))
        if "reason" in raw:
            job = target if target in job_pods else target.rsplit("-", 1)[0]
            status = outcome.result.job_status.get(job) if outcome.result else None
            got = status.reason if status else None
            if got != raw["reason"]:
                failures.append(f"{target}: reason {got!r}, expected {raw['reason']!r}")
    for i, pods in enumerate(outcome.history):
        for target, raw in scenario.expect.items():
            if not isinstance(raw, dict) or "status" not in raw:
                continue
            for pod in job_pods.get(target) or [target]:
                got = pods.get(pod)
                if got is None:
                    continue
                bad = {"Pending": ("Pipelined", "Releasing"), "Running": ("Releasing",)}
                if got.status in bad.get(raw["status"], ()):
                    failures.append(f"{pod}: {got.status} in extra round {i + 1}, "
                                    f"expected to stay {raw['status']}")
    return failures


def _check_pod(scenario: Scenario, outcome: Outcome, pod: str, raw: dict[str, Any],
               initial_groups: set[str], job_pods: dict[str, list[str]]) -> list[str]:
    got = outcome.pods.get(pod)
    if got is None:
        return [f"{pod}: not in the outcome"]
    out = []
    if "status" in raw and got.status != raw["status"]:
        out.append(f"{pod}: status {got.status}, expected {raw['status']}")
    if "node" in raw and got.node != raw["node"]:
        out.append(f"{pod}: node {got.node}, expected {raw['node']}")
    if "device" in raw:
        want = str(raw["device"])
        have = got.gpu_groups[0] if got.gpu_groups else None
        if want == "new":
            if have is None or have in initial_groups:
                out.append(f"{pod}: device {have}, expected a new device")
        elif want.startswith("same_as "):
            other = want.split(" ", 1)[1]
            other_pod = job_pods.get(other, [other])[0]
            theirs = outcome.pods.get(other_pod)
            if theirs is None or not theirs.gpu_groups or theirs.gpu_groups[0] != have:
                out.append(f"{pod}: device {have}, expected the same as {other_pod} "
                           f"({theirs.gpu_groups if theirs else None})")
        elif have != want:
            out.append(f"{pod}: device {have}, expected {want}")
    if "accepted_gpu_portion" in raw:
        result = outcome.result
        binds = [b for b in (result.binds if result else []) if b.pod == pod]
        portion = binds[0].gpu_portion if binds else None
        if portion is None or abs(portion - float(raw["accepted_gpu_portion"])) > 1e-9:
            out.append(f"{pod}: accepted GPU portion {portion}, "
                       f"expected {raw['accepted_gpu_portion']}")
    return out


def _check_fairshare(scenario: Scenario, outcome: Outcome) -> list[str]:
    failures = []
    expect = scenario.expect
    for name, want in (expect.get("fair_share") or {}).items():
        got = outcome.fair_share.get(str(name))
        if got is None or abs(got - float(want)) > 1e-9:
            failures.append(f"fair share of {name}: {got}, expected {want}")
    if "unassigned" in expect and abs(outcome.unassigned - float(expect["unassigned"])) > 1e-9:
        failures.append(f"unassigned {outcome.unassigned}, expected {expect['unassigned']}")
    unknown = set(expect) - {"fair_share", "unassigned"}
    if unknown:
        failures.append(f"unsupported expectation field(s) {sorted(unknown)}")
    return failures



