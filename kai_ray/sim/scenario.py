"""Scenario files (docs/scenario-format.md, v1): parse, validate, and build core snapshots.

Unknown fields are errors (a scenario that uses something we do not model must fail loudly, not
pass by ignoring it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

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
# amounts past 2**53 are not exact in a float and overflow the core's int64 sums
MAX_AMOUNT = 2**53
MAX_PRIORITY = 2**31 - 1  # Kubernetes priorities are int32
MAX_ROUNDS = 1000  # full_cycle rounds; more is a hang, not a scenario
ACTIONS = SchedulerConfig().actions  # every action the core runs, in its default order

Amount = Annotated[int, Field(ge=0, le=MAX_AMOUNT)]
Priority = Annotated[int, Field(ge=-MAX_PRIORITY - 1, le=MAX_PRIORITY)]
Action = Literal["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]


class ScenarioError(ValueError):
    """A scenario file that cannot be run, with where and why."""


class _Strict(BaseModel):
    # strict: YAML's `true` is not 1 and "5" is not 5; no NaN or infinity anywhere
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True,
                              allow_inf_nan=False)


class ForeignSpec(_Strict):
    """Requests of pods another scheduler placed on the node (not ours to move)."""

    cpu_m: Amount = 0
    memory_bytes: Amount = 0
    gpus: Amount = 0
    pods: Amount = 0


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
    name: str = Field(min_length=1)
    gpus: Amount = 0
    cpu_m: Amount = DEFAULT_CPU_M
    memory_bytes: Amount = DEFAULT_MEMORY
    gpu_memory_mib: int = Field(100, gt=0, le=MAX_AMOUNT)
    pods: Amount = 110
    gpu_product: str | None = None
    # live-cluster snapshots (kai-ray snapshot) also carry these; all optional
    labels: dict[str, str] | None = None
    ready: bool = True
    unschedulable: bool = False
    gpu_memory_synced: bool = True
    foreign: ForeignSpec | None = None
    taints: list[TaintSpec] | None = None


def _quota_value(value: float | None) -> float | None:
    # -1 means unlimited; any other negative value is a mistake the core would compute with
    if value is not None and value != -1 and value < 0:
        raise ValueError("must be -1 (unlimited) or >= 0")
    return value


def _weight(value: float | None) -> float | None:
    # KAI's fixtures give the shared parent queue weight -1 (docs/scenario-format.md), so -1
    # stays valid
    if value is not None and value != -1 and value < 0:
        raise ValueError("must be >= 0 (or -1, as KAI's fixtures give a parent queue)")
    return value


QuotaValue = Annotated[float | None, AfterValidator(_quota_value)]


class QuotaSpec(_Strict):
    quota: QuotaValue = None
    limit: QuotaValue = None
    weight: Annotated[float | None, AfterValidator(_weight)] = None


class QueueSpec(_Strict):
    name: str = Field(min_length=1)
    parent: str | None = None
    priority: Priority = 100
    gpu: QuotaSpec | None = None
    cpu: QuotaSpec | None = None
    memory: QuotaSpec | None = None
    age_s: float | None = None  # created this long before the scenario's now
    display_name: str | None = None
    preempt_min_runtime_s: float | None = Field(None, ge=0)
    reclaim_min_runtime_s: float | None = Field(None, ge=0)


class RequestSpec(_Strict):
    gpu: Amount | None = None
    gpu_fraction: float | None = Field(None, gt=0, le=1)
    gpu_memory_mib: int | None = Field(None, gt=0, le=MAX_AMOUNT)
    gpu_fraction_num_devices: int | None = Field(None, gt=0, le=MAX_AMOUNT)
    cpu_m: Amount | None = None
    memory_bytes: Amount | None = None

    @model_validator(mode="after")
    def _one_gpu_kind(self) -> RequestSpec:
        # the webhook refuses these combinations; the core would silently pick one
        if self.gpu_fraction is not None and self.gpu:
            raise ValueError("gpu_fraction and gpu (whole GPUs) together: give one")
        if self.gpu_memory_mib is not None and (self.gpu_fraction is not None or self.gpu):
            raise ValueError("gpu_memory_mib with gpu_fraction or gpu: give one")
        if self.gpu_fraction_num_devices is not None and self.gpu_fraction is None \
                and self.gpu_memory_mib is None:
            raise ValueError("gpu_fraction_num_devices needs gpu_fraction or gpu_memory_mib")
        return self


TaskState = Literal["Pending", "Running", "Releasing", "Pipelined", "Binding", "Failed",
                    "Succeeded", "Bound", "Gated"]


class TaskSpec(RequestSpec):
    state: TaskState = "Pending"
    node: str | None = None
    device: str | None = None
    task_priority: Priority | None = None
    subgroup: str | None = None
    name: str | None = Field(None, min_length=1)  # pod name (default <job>-<index>)
    devices: list[str] | None = None  # shared-GPU groups of a multi-device fractional pod
    node_selector: dict[str, str] | None = None
    tolerations: list[TolerationSpec] | None = None
    node_affinity: list[TermSpec] | None = None  # required terms (ORed)
    ray_head: bool = False
    age_s: float | None = None


class SubGroupSpec(_Strict):
    name: str = Field(min_length=1)
    min_member: int = Field(ge=1, le=MAX_AMOUNT)


class JobSpec(_Strict):
    name: str = Field(min_length=1)
    queue: str
    priority: Priority = 50
    min_member: int | None = Field(None, ge=1, le=MAX_AMOUNT)
    per_task: RequestSpec = RequestSpec()
    tasks: list[TaskSpec]
    stale_since_s: float | None = None
    preemptible: bool | None = None
    namespace: str = Field("default", min_length=1)
    subgroups: list[SubGroupSpec] | None = None
    age_s: float | None = None
    last_start_age_s: float | None = None  # min-runtime: started this long ago


class PluginSpec(_Strict):
    name: Literal["nodeplacement", "gpupack", "gpuspread"]
    args: dict[str, str] | None = None

    @model_validator(mode="after")
    def _known_args(self) -> PluginSpec:
        args = self.args or {}
        if self.name != "nodeplacement":
            if args:
                raise ValueError(f"{self.name} takes no args")
            return self
        for key, value in args.items():
            if key not in ("gpu", "cpu"):
                raise ValueError(f"nodeplacement args: unknown key {key!r}; known: gpu, cpu")
            if value not in ("binpack", "spread"):
                raise ValueError(f"nodeplacement args.{key}: expected binpack or spread, "
                                 f"got {value!r}")
        return self


class ConfigSpec(_Strict):
    plugins_only: list[PluginSpec] | None = None
    staleness_grace_period_s: float | None = Field(None, ge=0)
    actions: list[Action] | None = None
    max_consolidation_preemptees: int | None = Field(None, ge=0, le=MAX_AMOUNT)
    gpu_packing: str | None = None  # kai_ray.core.packing.POLICIES; default "kai"

    @field_validator("gpu_packing")
    @classmethod
    def _known_packing(cls, value: str | None) -> str | None:
        if value is not None and value not in POLICIES:
            raise ValueError(f"expected one of {list(POLICIES)}")
        return value

    @field_validator("actions")
    @classmethod
    def _distinct_actions(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError(f"expected at least one of {list(ACTIONS)} (omit the key "
                                 "for all of them)")
            if len(set(value)) != len(value):
                raise ValueError("an action is listed twice")
        return value


class ExpectSpec(_Strict):
    status: str | None = None
    node: str | None = None
    device: str | None = None
    reason: str | None = None
    accepted_gpu_portion: float | None = None


class FairShareQueueSpec(_Strict):
    name: str = Field(min_length=1)
    deserved: QuotaValue
    weight: float = Field(ge=0)
    request: float = Field(ge=0)
    limit: QuotaValue = None
    priority: Priority | None = None


class FairShareExpectSpec(_Strict):
    fair_share: dict[str, float] = {}
    unassigned: float | None = None


RunKind = Literal["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction",
                  "full_cycle", "fairshare_only"]


class Scenario(_Strict):
    id: str = Field(min_length=1)
    title: str = ""
    source: dict[str, Any] | None = None
    run: RunKind
    rounds: int = Field(2, ge=1, le=MAX_ROUNDS)
    config: ConfigSpec | None = None
    nodes: list[NodeSpec] = []
    queues: list[Any] = []
    jobs: list[JobSpec] = []
    expect: dict[str, Any] = {}
    why: str | None = None
    total_gpus: float | None = Field(None, ge=0)

    def queue_specs(self) -> list[QueueSpec]:
        return [QueueSpec.model_validate(q) for q in self.queues]

    def fairshare_specs(self) -> list[FairShareQueueSpec]:
        return [FairShareQueueSpec.model_validate(q) for q in self.queues]


class ScenarioFile(_Strict):
    model_config = ConfigDict(extra="allow")
    scenarios: list[Scenario]


def load(path: str | Path) -> list[Scenario]:
    """Read a scenario file; errors name the file, the scenario and the field (one line)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start} is "
                            f"{data[exc.start]:#04x})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None
    if not isinstance(raw, dict) or "scenarios" not in raw:
        raise ScenarioError(f"{path}: expected a mapping with a 'scenarios' list")
    unknown = [str(k) for k in raw if k not in ("scenarios", "conventions")
               and not (isinstance(k, str) and k.startswith("x-"))]
    if unknown:
        raise ScenarioError(f"{path}: unsupported top-level field(s): {', '.join(unknown)}")
    if not isinstance(raw["scenarios"], list):
        raise ScenarioError(f"{path}: scenarios: expected a list, "
                            f"got {type(raw['scenarios']).__name__}")
    out: list[Scenario] = []
    ids: dict[str, int] = {}
    for i, item in enumerate(raw["scenarios"]):
        ident = item.get("id", f"#{i}") if isinstance(item, dict) else f"#{i}"
        try:
            scenario = Scenario.model_validate(item)
        except ValidationError as exc:
            raise ScenarioError(f"{path}: scenario {ident}: {_describe(exc)}") from None
        try:
            _check(scenario)
        except ScenarioError as exc:
            raise ScenarioError(f"{path}: scenario {ident}: {exc}") from None
        if scenario.id in ids:
            raise ScenarioError(f"{path}: scenarios.{i}.id: duplicate id {scenario.id!r} "
                                f"(first at scenarios.{ids[scenario.id]})")
        ids[scenario.id] = i
        out.append(scenario)
    return out


def _check(scenario: Scenario) -> None:
    """What one model cannot see: the queues (whose shape depends on `run`), names that must
    be unique, the expectations' shape, and what `snapshot_of` refuses."""
    fairshare = scenario.run == "fairshare_only"
    spec: type[_Strict] = FairShareQueueSpec if fairshare else QueueSpec
    for i, q in enumerate(scenario.queues):
        try:
            spec.model_validate(q)
        except ValidationError as exc:
            raise ScenarioError(_describe(exc, f"queues.{i}")) from None
    _unique("queues", [q.get("name") if isinstance(q, dict) else None for q in scenario.queues],
            "queue")
    _unique("nodes", [n.name for n in scenario.nodes], "node")
    _unique("jobs", [j.name for j in scenario.jobs], "job")
    pods: dict[tuple[str, str], str] = {}
    for j, job in enumerate(scenario.jobs):
        for t, task in enumerate(job.tasks):
            key = (job.namespace, task.name or f"{job.name}-{t}")
            where = f"jobs.{j}.tasks.{t}"
            if key in pods:
                raise ScenarioError(f"{where}.name: duplicate pod {key[1]!r} in namespace "
                                    f"{key[0]!r} (first at {pods[key]})")
            pods[key] = where
        _unique(f"jobs.{j}.subgroups", [s.name for s in job.subgroups or []], "subgroup")
    if fairshare:
        if scenario.total_gpus is None:
            raise ScenarioError("total_gpus: required by run: fairshare_only")
        try:
            FairShareExpectSpec.model_validate(scenario.expect)
        except ValidationError as exc:
            raise ScenarioError(_describe(exc, "expect")) from None
        return
    for target, raw in scenario.expect.items():
        try:
            ExpectSpec.model_validate(raw)
        except ValidationError as exc:
            raise ScenarioError(_describe(exc, f"expect.{target}")) from None
    try:
        config_of(scenario)
        snapshot_of(scenario)
    except ScenarioError as exc:  # load names the scenario itself
        raise ScenarioError(str(exc).removeprefix(f"scenario {scenario.id}: ")) from None


def _unique(where: str, names: list[str | None], what: str) -> None:
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in first:
            raise ScenarioError(f"{where}.{i}.name: duplicate {what} name {name!r} "
                                f"(first at {where}.{first[name]})")
        first[name] = i


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe(exc: ValidationError, prefix: str = "") -> str:
    """`where: what, got value` for each error (pydantic's dotted path, list indices as
    numbers), all on one line."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        got = "" if isinstance(value, dict | list) or err["type"] == "missing" \
            else f", got {value!r}"
        parts.append(f"{where or '(scenario)'}: {msg}{got}")
    return _one_line("; ".join(parts))


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
            where = f"scenario {scenario.id}: jobs.{j}.tasks.{i}"
            if t.node is not None and t.node not in node_names:
                raise ScenarioError(f"{where}.node: unknown node {t.node!r}")
            if t.state not in ("Pending", "Failed", "Gated") and t.node is None:
                raise ScenarioError(f"{where}.node: state {t.state} needs a node")
            req = _request(spec.per_task, t)
            groups: tuple[str, ...] = ()
            if req.is_shared and t.node is not None and t.state != "Pending":
                if not t.device and not t.devices:
                    raise ScenarioError(f"{where}.device: a placed fractional task needs a "
                                        "device")
                groups = tuple(t.devices) if t.devices else (str(t.device),)
                if len(groups) != req.fraction_devices:
                    raise ScenarioError(f"{where}.devices: {len(groups)} device(s) for a "
                                        f"request of {req.fraction_devices}")
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

