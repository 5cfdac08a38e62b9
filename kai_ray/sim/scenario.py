"""Scenario files (shared/scenarios/FORMAT.md, v1): parse, validate, and build core snapshots.

Unknown fields are errors (a scenario that uses something we do not model must fail loudly, not
pass by ignoring it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kai_ray.core.constraints import Requirement, Taint, Term, Toleration
from kai_ray.core.model import (
    Job,
    Node,
    NodePlacement,
    Pod,
    PodStatus,
    Queue,
    Request,
    ResourceQuota,
    SchedulerConfig,
    Snapshot,
    SubGroup,
)
from kai_ray.core.packing import POLICIES

DEFAULT_CPU_M = 20_000_000
DEFAULT_MEMORY = 20_000_000_000
DEFAULT_TASK_CPU_M = 1000
DEFAULT_TASK_MEMORY = 1_000_000_000
MINUTE = 60.0


class ScenarioError(ValueError):
    """A scenario file that cannot be run, with where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ForeignSpec(_Strict):
    """Requests of pods another scheduler placed on the node (not ours to move)."""

    cpu_m: int = Field(0, ge=0)
    memory_bytes: int = Field(0, ge=0)
    gpus: int = Field(0, ge=0)
    pods: int = Field(0, ge=0)


class TaintSpec(_Strict):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class TolerationSpec(_Strict):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class RequirementSpec(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = []


class TermSpec(_Strict):
    """One required node affinity term (Kubernetes' nodeSelectorTerm); match_fields only
    knows metadata.name."""

    match_expressions: list[RequirementSpec] = []
    match_fields: list[RequirementSpec] = []


class NodeSpec(_Strict):
    name: str
    gpus: int = Field(0, ge=0)
    cpu_m: int = Field(DEFAULT_CPU_M, ge=0)
    memory_bytes: int = Field(DEFAULT_MEMORY, ge=0)
    gpu_memory_mib: int = Field(100, gt=0)
    pods: int = Field(110, ge=0)
    gpu_product: str | None = None
    # live-cluster snapshots (kai-ray snapshot) also carry these; all optional
    labels: dict[str, str] | None = None
    ready: bool = True
    unschedulable: bool = False
    gpu_memory_synced: bool = True
    foreign: ForeignSpec | None = None
    taints: list[TaintSpec] | None = None


class QuotaSpec(_Strict):
    quota: float | None = None
    limit: float | None = None
    weight: float | None = None


class QueueSpec(_Strict):
    name: str
    parent: str | None = None
    priority: int = 100
    gpu: QuotaSpec | None = None
    cpu: QuotaSpec | None = None
    memory: QuotaSpec | None = None
    age_s: float | None = None  # created this long before the scenario's now
    display_name: str | None = None
    preempt_min_runtime_s: float | None = Field(None, ge=0)
    reclaim_min_runtime_s: float | None = Field(None, ge=0)


class RequestSpec(_Strict):
    gpu: int | None = Field(None, ge=0)
    gpu_fraction: float | None = Field(None, gt=0, le=1)
    gpu_memory_mib: int | None = Field(None, gt=0)
    gpu_fraction_num_devices: int | None = Field(None, gt=0)
    cpu_m: int | None = Field(None, ge=0)
    memory_bytes: int | None = Field(None, ge=0)


TaskState = Literal["Pending", "Running", "Releasing", "Pipelined", "Binding", "Failed",
                    "Succeeded", "Bound", "Gated"]


class TaskSpec(RequestSpec):
    state: TaskState = "Pending"
    node: str | None = None
    device: str | None = None
    task_priority: int | None = None
    subgroup: str | None = None
    name: str | None = None  # pod name (default <job>-<index>)
    devices: list[str] | None = None  # shared-GPU groups of a multi-device fractional pod
    node_selector: dict[str, str] | None = None
    tolerations: list[TolerationSpec] | None = None
    node_affinity: list[TermSpec] | None = None  # required terms (ORed)
    ray_head: bool = False
    age_s: float | None = None


class SubGroupSpec(_Strict):
    name: str
    min_member: int = Field(ge=1)


class JobSpec(_Strict):
    name: str
    queue: str
    priority: int = 50
    min_member: int | None = Field(None, ge=1)
    per_task: RequestSpec = RequestSpec()
    tasks: list[TaskSpec]
    stale_since_s: float | None = None
    preemptible: bool | None = None
    namespace: str = "default"
    subgroups: list[SubGroupSpec] | None = None
    age_s: float | None = None
    last_start_age_s: float | None = None  # min-runtime: started this long ago


class PluginSpec(_Strict):
    name: str
    args: dict[str, str] | None = None


class ConfigSpec(_Strict):
    plugins_only: list[PluginSpec] | None = None
    staleness_grace_period_s: float | None = None
    actions: list[str] | None = None
    max_consolidation_preemptees: int | None = Field(None, ge=0)
    gpu_packing: str | None = None  # kai_ray.core.packing.POLICIES; default "kai"


class ExpectSpec(_Strict):
    status: str | None = None
    node: str | None = None
    device: str | None = None
    reason: str | None = None
    accepted_gpu_portion: float | None = None


class FairShareQueueSpec(_Strict):
    name: str
    deserved: float
    weight: float
    request: float
    limit: float | None = None
    priority: int | None = None


RunKind = Literal["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction",
                  "full_cycle", "fairshare_only"]


class Scenario(_Strict):
    id: str
    title: str = ""
    source: dict[str, Any] | None = None
    run: RunKind
    rounds: int = Field(2, ge=1)
    config: ConfigSpec | None = None
    nodes: list[NodeSpec] = []
    queues: list[Any] = []
    jobs: list[JobSpec] = []
    expect: dict[str, Any] = {}
    why: str | None = None
    total_gpus: float | None = None

    def queue_specs(self) -> list[QueueSpec]:
        return [QueueSpec.model_validate(q) for q in self.queues]

    def fairshare_specs(self) -> list[FairShareQueueSpec]:
        return [FairShareQueueSpec.model_validate(q) for q in self.queues]


class ScenarioFile(_Strict):
    model_config = ConfigDict(extra="allow")
    scenarios: list[Scenario]


def load(path: str | Path) -> list[Scenario]:
    """Read a scenario file; errors name the file, the scenario and the field."""
    text = Path(path).read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or "scenarios" not in raw:
        raise ScenarioError(f"{path}: expected a mapping with a 'scenarios' list")
    unknown = [k for k in raw if k not in ("scenarios", "conventions") and not k.startswith("x-")]
    if unknown:
        raise ScenarioError(f"{path}: unsupported top-level field(s): {', '.join(unknown)}")
    out = []
    for i, item in enumerate(raw["scenarios"]):
        ident = item.get("id", f"#{i}") if isinstance(item, dict) else f"#{i}"
        try:
            scenario = Scenario.model_validate(item)
            if scenario.run == "fairshare_only":
                scenario.fairshare_specs()
            else:
                scenario.queue_specs()
        except ValidationError as exc:
            raise ScenarioError(f"{path}: scenario {ident}: {_describe(exc)}") from exc
        out.append(scenario)
    return out


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------- to the core


def _quota(spec: QuotaSpec | None, default: ResourceQuota) -> ResourceQuota:
    if spec is None:
        return default
    return ResourceQuota(
        quota=default.quota if spec.quota is None else spec.quota,
        limit=default.limit if spec.limit is None else spec.limit,
        weight=default.weight if spec.weight is None else spec.weight,
    )


def _request(base: RequestSpec, task: TaskSpec) -> Request:
    """The pod's request: a task that names any request key replaces `per_task` entirely."""
    keys = RequestSpec.model_fields
    own = any(getattr(task, k) is not None for k in keys)
    spec = RequestSpec.model_validate({k: getattr(task, k) for k in keys}) if own else base
    fraction = spec.gpu_fraction
    return Request(
        cpu_m=DEFAULT_TASK_CPU_M if spec.cpu_m is None else spec.cpu_m,
        memory=DEFAULT_TASK_MEMORY if spec.memory_bytes is None else spec.memory_bytes,
        gpus=spec.gpu or 0,
        gpu_fraction_milli=round(fraction * 1000) if fraction else 0,
        gpu_memory_mib=spec.gpu_memory_mib or 0,
        fraction_devices=spec.gpu_fraction_num_devices or 1,
    )


def config_of(scenario: Scenario) -> SchedulerConfig:
    cfg = scenario.config
    placement = NodePlacement()
    device_order = None
    grace = 60.0
    if cfg is not None:
        for plugin in cfg.plugins_only or []:
            if plugin.name == "nodeplacement":
                args = plugin.args or {}
                placement = NodePlacement(gpu=args.get("gpu", "binpack"),
                                          cpu=args.get("cpu", "binpack"))
            elif plugin.name in ("gpupack", "gpuspread"):
                device_order = plugin.name
            else:
                raise ScenarioError(f"scenario {scenario.id}: unsupported plugin {plugin.name!r}")
        if cfg.staleness_grace_period_s is not None:
            grace = cfg.staleness_grace_period_s
    actions = tuple(cfg.actions) if cfg and cfg.actions else SchedulerConfig().actions
    preemptees = SchedulerConfig().max_consolidation_preemptees
    if cfg is not None and cfg.max_consolidation_preemptees is not None:
        preemptees = cfg.max_consolidation_preemptees
    packing = "kai"
    if cfg is not None and cfg.gpu_packing is not None:
        if cfg.gpu_packing not in POLICIES:
            raise ScenarioError(f"scenario {scenario.id}: config.gpu_packing: "
                                f"{cfg.gpu_packing!r} is not one of {list(POLICIES)}")
        packing = cfg.gpu_packing
    return SchedulerConfig(placement=placement, gpu_device_order=device_order,
                           staleness_grace_period_s=grace, actions=actions,
                           max_consolidation_preemptees=preemptees, gpu_packing=packing)


NOW = 10_000.0


def snapshot_of(scenario: Scenario, now: float = NOW) -> Snapshot:
    nodes = tuple(_node(n) for n in scenario.nodes)
    node_names = {n.name for n in nodes}
    queues = []
    for i, q in enumerate(scenario.queue_specs()):
        queues.append(Queue(
            name=q.name, parent=q.parent, priority=q.priority,
            gpu=_quota(q.gpu, ResourceQuota(0.0, -1.0, 0.0)),
            cpu=_quota(q.cpu, ResourceQuota(-1.0, -1.0, 1.0)),
            memory=_quota(q.memory, ResourceQuota(-1.0, -1.0, 1.0)),
            created=i * MINUTE if q.age_s is None else now - q.age_s,
            display_name=q.display_name, preempt_min_runtime_s=q.preempt_min_runtime_s,
            reclaim_min_runtime_s=q.reclaim_min_runtime_s))
    jobs = []
    for j, spec in enumerate(scenario.jobs):
        created = j * MINUTE if spec.age_s is None else now - spec.age_s
        pods = []
        for i, t in enumerate(spec.tasks):
            if t.node is not None and t.node not in node_names:
                raise ScenarioError(f"scenario {scenario.id}: job {spec.name} task {i}: "
                                    f"unknown node {t.node!r}")
            if t.state not in ("Pending", "Failed", "Gated") and t.node is None:
                raise ScenarioError(f"scenario {scenario.id}: job {spec.name} task {i}: "
                                    f"state {t.state} needs a node")
            req = _request(spec.per_task, t)
            groups: tuple[str, ...] = ()
            if req.is_shared and t.node is not None and t.state != "Pending":
                if not t.device and not t.devices:
                    raise ScenarioError(f"scenario {scenario.id}: job {spec.name} task {i}: "
                                        "a placed fractional task needs a device")
                groups = tuple(t.devices) if t.devices else (str(t.device),)
            pods.append(Pod(name=t.name or f"{spec.name}-{i}", request=req,
                            status=PodStatus(t.state), node=t.node, gpu_groups=groups,
                            namespace=spec.namespace, task_priority=t.task_priority,
                            created=created if t.age_s is None else now - t.age_s,
                            subgroup=t.subgroup, is_ray_head=t.ray_head,
                            node_selector=tuple(sorted((t.node_selector or {}).items())),
                            tolerations=tuple(Toleration(x.key, x.operator, x.value, x.effect)
                                              for x in t.tolerations or []),
                            node_affinity=_affinity(t.node_affinity)))
        subgroups = tuple((sg.name, sg.min_member) for sg in spec.subgroups or [])
        jobs.append(Job(
            name=spec.name, queue=spec.queue, priority=spec.priority, pods=tuple(pods),
            min_member=spec.min_member if spec.min_member is not None else len(spec.tasks),
            namespace=spec.namespace, created=created, preemptible=spec.preemptible,
            subgroups=tuple(SubGroup(n, m) for n, m in subgroups),
            stale_since=None if spec.stale_since_s is None else now - spec.stale_since_s,
            last_start=None if spec.last_start_age_s is None else now - spec.last_start_age_s))
    return Snapshot(nodes=nodes, queues=tuple(queues), jobs=tuple(jobs))


def _node(n: NodeSpec) -> Node:
    labels = dict(n.labels or {})
    if n.gpu_product:
        labels["nvidia.com/gpu.product"] = n.gpu_product
    foreign = n.foreign or ForeignSpec()
    return Node(name=n.name, cpu_m=n.cpu_m, memory=n.memory_bytes, gpus=n.gpus,
                gpu_memory_mib=n.gpu_memory_mib, gpu_memory_synced=n.gpu_memory_synced,
                max_pods=n.pods, labels=tuple(sorted(labels.items())), ready=n.ready,
                unschedulable=n.unschedulable, foreign_cpu_m=foreign.cpu_m,
                foreign_memory=foreign.memory_bytes, foreign_gpus=foreign.gpus,
                foreign_pods=foreign.pods,
                taints=tuple(Taint(t.key, t.value, t.effect) for t in n.taints or []))


def _affinity(terms: list[TermSpec] | None) -> tuple[Term, ...] | None:
    if terms is None:
        return None
    return tuple(tuple(Requirement(r.key, r.operator, tuple(r.values), field)
                       for field, reqs in ((False, t.match_expressions), (True, t.match_fields))
                       for r in reqs)
                 for t in terms)

