"""KAI v0.12.0 patched to decide as kai-ray does on one documented point (docs/kai-deviations.md).

The KAI fuzzer (kai_ray.testing.kai_fuzz) uses these to attribute a difference: where kai-ray's
decisions equal none of stock KAI's answers but equal one of a variant's, the round differs only
by that variant's deviation. Each variant is a few literal replacements in KAI's own source, so
what it changes is plain to read here; everything else is KAI's code as released.

A new variant is one more `VARIANTS` entry. `old` anchors are short (a line or an expression) and
must occur exactly once in their file: a KAI version that moves them fails loudly, not silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from kai_ray.testing.kai_harness import HarnessMissing, build_harness, cache_dir, harness_dir

KAI_MODULE = "github.com/NVIDIA/KAI-scheduler"


@dataclass(frozen=True)
class Edit:
    """A literal replacement in one KAI source file; `old` must occur exactly once."""

    path: str  # relative to the KAI module root
    old: str
    new: str


@dataclass(frozen=True)
class Variant:
    name: str  # e.g. "dev02-no-bound-victims"
    deviation: str  # "DEV-02"
    why: str  # one line
    edits: tuple[Edit, ...]


class VariantError(RuntimeError):
    """A variant's edit does not apply to this KAI source (anchor missing or not unique)."""


def _go(text: str, depth: int = 1) -> str:
    """Go source written here with four spaces a level, as KAI's files are indented: by tabs,
    `depth` of them before the text's own levels."""
    lines = textwrap.dedent(text).strip("\n").splitlines()
    return "".join(("\t" * (depth + (len(line) - len(line.lstrip(" "))) // 4)
                    + line.lstrip(" ") if line.strip() else "") + "\n" for line in lines)


_SESSION = "pkg/scheduler/framework/session.go"
_INPUT_JOBS = "pkg/scheduler/actions/utils/input_jobs.go"
_BINDING = _go("""
    if err := ssn.updatePodOnSession(pod, pod_status.Binding); err != nil {
""")
_POD_STATUS = _go("""
    "github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_status"
""")
_INITIALIZE = "func (jobsOrder *JobsOrderByQueues) InitializeWithJobs("
_INIT_QUOTA = _go("""
    quota.GPU = ni.getGpuMemoryFractionalOnNode(ni.GetResourceGpuMemory(pi.ResReq))
""", depth=2)
_ROUNDED = _go("""
    portionAsDecimals := int64(math.Round(portion * gpuPortionsAsDecimalsRoundingFactor))
    return float64(portionAsDecimals*count) / gpuPortionsAsDecimalsRoundingFactor
""")

_ACTION = "pkg/scheduler/actions/common/action.go"
_POD_INFO = _go("""
    "github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_info"
""")
_EVICT_LOOP = _go("""
    for _, task := range preempteeTasks {
        message, found := messages[task.UID]
""")

_PRIORITY_QUEUE = "pkg/scheduler/scheduler_util/priority_queue.go"
_IDLE_GPUS = "pkg/scheduler/actions/common/solvers/accumulated_scenario_filters/idle_gpus.go"
_IDLE_GPU_MAP = ("\tidleGpusMap, relevantNodesSorted := createGpuMap(nodeInfosMap, "
                 "len(scenario.PendingTasks()))\n")
_SHARING_NODE_INFO = "pkg/scheduler/api/node_info/gpu_sharing_node_info.go"
_STATEMENT = "pkg/scheduler/framework/statement.go"
_JOB_INFO = "pkg/scheduler/api/podgroup_info/job_info.go"
_INVALIDATE = "func (pgi *PodGroupInfo) invalidateTasksCache() {\n"
_FIX = "func (q *PriorityQueue) Fix(index int) {\n"
_NEXT_DEPARTMENT = "\tdepartment := jobsOrder.getNextDepartment()\n"

_UNALLOCATED_SHARER = _go("""
    ni.AllocatedSharedGPUsMemory[gpuGroup] -= ni.GetResourceGpuMemory(task.ResReq)

    if ni.UsedSharedGPUsMemory[gpuGroup] <= 0 {
""", depth=2)

_USED_SHARED_GPUS = "func (ni *NodeInfo) getNumberOfUsedSharedGPUs() int {\n"
_LAST_RELEASING_SHARER = _go("""
        ni.markSharedGpuAsReleasing(gpuGroup)
    }
    if int(ni.GetNumberOfGPUsInNode()) < int(ni.Idle.GPUs())+ni.getNumberOfUsedGPUs() {
""", depth=3)

_GIVE_BACK_IDLE = _go("""
    // no other fractional was allocated here yet
    if int(ni.GetNumberOfGPUsInNode()) >= int(ni.Idle.GPUs())+ni.getNumberOfUsedGPUs() {
""", depth=3)
_GIVE_BACK_IDLE_DEV08 = _go("""
    // no other fractional was allocated here yet
    if int(ni.GetNumberOfGPUsInNode()) >= int(ni.Idle.GPUs())+ni.getNumberOfUsedGPUs()-
        ni.kaiRayPipelinedOnlyGPUs() { // kai-ray variant DEV-08
""", depth=3)
_USED_GPUS = "func (ni *NodeInfo) getNumberOfUsedGPUs() int {\n"
_UNEVICT_HERE = ("\tif foundOnNode && !updateTaskIfExistsOnNode && "
                 "!isSharedAndMoveToDifferentGPU {\n")

_UNPIPELINE = ("\t\t\treturn s.unpipeline(task, previousNode, previousStatus, previousGpuGroup, "
               "previousIsVirtualStatus)\n")

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant(
        name="dev02-no-bound-victims",
        deviation="DEV-02",
        why="a pod bound earlier in the same cycle is no victim (pipelined and running pods are)",
        edits=(
            # the session remembers the pods it binds (allocate's statements, a reclaim or a
            # preempt that needed no eviction): a status cannot tell them from pods that were
            # Binding when the cycle began, which stay victims
            Edit(_SESSION, "\tk8sResourceStateCache sync.Map\n", _go("""
                    k8sResourceStateCache sync.Map

                    // kai-ray variant DEV-02: the pods this session bound
                    KaiRayBoundInSession map[common_info.PodID]bool
                """)),
            Edit(_SESSION, _BINDING, _go("""
                    if ssn.KaiRayBoundInSession == nil {
                        ssn.KaiRayBoundInSession = map[common_info.PodID]bool{}
                    }
                    ssn.KaiRayBoundInSession[pod.UID] = true
                """) + _BINDING),
            # every victim queue (reclaim's, and utils.GetVictimsQueue's for preempt and
            # consolidation) is filled here: a victim job is seen without those pods, so its
            # order, the pods GetTasksToEvict offers and its count against its minimum are
            # those of the pods it had before the cycle and the pipelined ones, as in kai-ray
            Edit(_INPUT_JOBS, _POD_STATUS, _go("""
                    "github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_info"
                """) + _POD_STATUS),
            Edit(_INPUT_JOBS, "\tfor _, job := range jobsToOrder {\n", _go("""
                    for _, job := range jobsToOrder {
                        if jobsOrder.jobsOrderInitOptions.VictimQueue {
                            job = kaiRayVictimView(jobsOrder.ssn.KaiRayBoundInSession, job)
                            if job == nil {
                                continue
                            }
                        }
                """)),
            Edit(_INPUT_JOBS, _INITIALIZE, _go("""
                // kaiRayVictimView is the job as a victim: without the pods bound in this
                // session (a clone, as KAI's solvers make of a job's remaining pods); the job
                // itself when it has none of them, nil when they were all it had allocated.
                func kaiRayVictimView(bound map[common_info.PodID]bool,
                    job *podgroup_info.PodGroupInfo) *podgroup_info.PodGroupInfo {
                    var kept []*pod_info.PodInfo
                    dropped, active := false, false
                    for uid, pod := range job.GetAllPodsMap() {
                        if bound[uid] {
                            dropped = true
                            continue
                        }
                        kept = append(kept, pod)
                        active = active || pod_status.IsActiveAllocatedStatus(pod.Status)
                    }
                    if !dropped {
                        return job
                    }
                    if !active {
                        return nil
                    }
                    return job.CloneWithTasks(kept)
                }

            """, depth=0) + "\n" + _INITIALIZE),
        ),
    ),
    Variant(
        name="dev03-exact-fractions",
        deviation="DEV-03",
        why="a GPU fraction counts as asked in queue checks, not rounded to 1/100 (0.125 is "
            "not 0.13)",
        edits=(
            # the amount queues are charged and jobs checked with
            Edit("pkg/scheduler/api/resource_info/gpu_resource_requirment.go", _ROUNDED, _go("""
                    return portion * float64(count) // kai-ray variant DEV-03: not rounded
                """)),
            # the per-node check of a task against its queue's limit and non-preemptible quota
            # (proportion's IsTaskAllocationOnNodeOverCapacity) turns the fraction into GPU
            # memory (whole MiB) and back, rounded up to 1/100
            Edit("pkg/scheduler/api/node_info/node_info.go", _INIT_QUOTA, _go("""
                    if pi.ResReq.IsFractionalRequest() && pi.ResReq.GpuMemory() == 0 {
                        quota.GPU = pi.ResReq.GpuFractionalPortion() // kai-ray variant DEV-03
                    } else {
                """, depth=2) + "\t" + _INIT_QUOTA + _go("}", depth=2)),
        ),
    ),
    Variant(
        name="kai-bug-discarded-move",
        deviation="DEV-04",
        why="undoing a scenario that moved a shared-GPU victim to another device of its own "
            "node leaves nothing behind (KAI v0.12.0 counts the victim twice on the node)",
        edits=(
            # the move (ConsolidateSharedPodInfoToDifferentGPU) dropped the node's record of
            # the pod but left what it counted on the old device; its undo now puts the record
            # back, so undoing the eviction replaces it instead of adding the pod a second time
            Edit("pkg/scheduler/framework/statement.go", _UNPIPELINE, _go("""
                    err := s.unpipeline(task, previousNode, previousStatus, previousGpuGroup,
                        previousIsVirtualStatus)
                    if isSharedAndMoveToDifferentGPU {
                        node.PodInfos[taskKey] = taskOnNode // kai-ray variant DEV-04
                    }
                    return err
                """, depth=3)),
        ),
    ),
    Variant(
        name="kai-bug-double-eviction",
        deviation="DEV-05",
        why="a recorded victim already evicted in a by-pod scenario is not evicted (and its "
            "queue not charged off) a second time",
        edits=(
            # the scenario's recorded victims are evicted first (by_pod_solver.go:72); the
            # victims of a node (VictimsTasksFromNodes) hold every task group of a victim job,
            # the recorded group's clone too, and went through Statement.Evict again, calling
            # the proportion plugin's DeallocateFunc a second time for the same pod. The pod
            # the session holds is already Releasing then: skip it
            Edit(_ACTION, _POD_INFO, _POD_INFO + _go("""
                    "github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_status"
                """)),
            Edit(_ACTION, _EVICT_LOOP, _go("""
                    for _, task := range preempteeTasks {
                        if held, ok := ssn.PodGroupInfos[task.Job].GetAllPodsMap()[task.UID]; ok &&
                            held.Status == pod_status.Releasing {
                            continue // kai-ray variant DEV-05: evicted already
                        }
                        message, found := messages[task.UID]
                """)),
        ),
    ),
    Variant(
        name="kai-stale-queue-order",
        deviation="DEV-06",
        why="each job is popped from queues and departments ordered as they stand now (KAI "
            "v0.12.0 re-sorts only the top of each heap, lazily)",
        edits=(
            Edit(_PRIORITY_QUEUE, _FIX, _go("""
                // KaiRayReinit orders the whole heap again (kai-ray variant DEV-06).
                func (q *PriorityQueue) KaiRayReinit() {
                    heap.Init(&q.queue)
                }

            """, depth=0) + _FIX),
            # PopNextJob re-sorts only a heap's top element, and only on the next visit: a
            # department compared with another uses the queue its heap held on top when that
            # queue last gave a job, whose head job has changed since. Every heap is ordered
            # again before each pop, the queues' first (the departments' order reads them)
            Edit("pkg/scheduler/actions/utils/job_order_by_queue.go", _NEXT_DEPARTMENT, _go("""
                    for _, metadata := range jobsOrder.departmentIdToDepartmentMetadata {
                        metadata.queuesPriorityQueue.KaiRayReinit() // kai-ray variant DEV-06
                    }
                    jobsOrder.activeDepartments.KaiRayReinit()
                """) + _NEXT_DEPARTMENT),
        ),
    ),
    Variant(
        name="kai-stale-shared-gpu-entry",
        deviation="DEV-07",
        why="a device left with only pipelined sharers is not idle for the next fraction, "
            "however its last allocated sharer left (KAI v0.12.0 keeps an allocated-memory "
            "entry of 0 when an allocated sharer is taken off, and counts it as idle)",
        edits=(
            # EnoughIdleResourcesOnGpu tells a device only pipelined pods share by its missing
            # AllocatedSharedGPUsMemory entry; an allocated sharer taken off (allocate's
            # re-pipelining of a gang, an undone allocation) left the entry behind at 0
            Edit("pkg/scheduler/api/node_info/gpu_sharing_node_info.go", _UNALLOCATED_SHARER,
                 _go("""
                    ni.AllocatedSharedGPUsMemory[gpuGroup] -= ni.GetResourceGpuMemory(task.ResReq)
                    if ni.AllocatedSharedGPUsMemory[gpuGroup] == 0 {
                        delete(ni.AllocatedSharedGPUsMemory, gpuGroup) // kai-ray variant DEV-07
                    }

                    if ni.UsedSharedGPUsMemory[gpuGroup] <= 0 {
                """, depth=2)),
        ),
    ),
    Variant(
        name="kai-bug-pipelined-gpus-as-idle-taken",
        deviation="DEV-12",
        why="a shared device whose last allocated sharer is evicted keeps the node's idle GPUs "
            "as they were (KAI v0.12.0 counts whole GPUs pipelined pods wait for as taken from "
            "idle, and takes one more idle GPU away)",
        edits=(
            # a pipelined pod's whole GPUs are in Used but were charged to Releasing, not Idle
            # (node_info.go addTaskResources); the guard that keeps Idle + used within the node
            # (meant for a releasing pod that opens a device) counted them and took an idle GPU
            Edit(_SHARING_NODE_INFO, _USED_SHARED_GPUS, _go("""
                    // kaiRayPipelinedWholeGPUs counts the whole GPUs pipelined pods on the node
                    // wait for (charged to Releasing, not Idle): kai-ray variant DEV-12.
                    func (ni *NodeInfo) kaiRayPipelinedWholeGPUs() int {
                        gpus := 0.0
                        for _, pod := range ni.PodInfos {
                            if pod.Status == pod_status.Pipelined && !pod.IsSharedGPUAllocation() {
                                gpus += pod.AcceptedResource.GPUs()
                            }
                        }
                        return int(gpus)
                    }

                """, depth=0) + "\n" + _USED_SHARED_GPUS),
            Edit(_SHARING_NODE_INFO, _LAST_RELEASING_SHARER, _go("""
                        ni.markSharedGpuAsReleasing(gpuGroup)
                    }
                    // kai-ray variant DEV-12: the whole GPUs of pipelined pods left out
                    used := ni.getNumberOfUsedGPUs() - ni.kaiRayPipelinedWholeGPUs()
                    if int(ni.GetNumberOfGPUsInNode()) < int(ni.Idle.GPUs())+used {
                """, depth=3)),
        ),
    ),
    Variant(
        name="kai-bug-nil-scenario",
        deviation="DEV-14",
        why="a preemptor left with no pod to allocate gets no victim scenario, and no solution "
            "(KAI v0.12.0 builds its idle-GPU filter on the missing scenario and panics; "
            "upstream's own fix, fc2b3e23)",
        edits=(
            # a job whose pods a committed preemption evicted earlier in the action keeps its
            # cached pods to allocate (made while the evictions were virtual); its partial job
            # then has none, NewPodAccumulatedScenarioBuilder leaves the scenario nil and the
            # filter dereferences it. The guard upstream added (#1664)
            Edit(_IDLE_GPUS, _IDLE_GPU_MAP, _go("""
                if scenario == nil {
                    return nil // kai-ray variant DEV-14 (upstream fc2b3e23)
                }
            """) + _IDLE_GPU_MAP),
        ),
    ),
    Variant(
        name="kai-bug-stale-tasks-cache",
        deviation="DEV-14",
        why="a committed eviction drops its job's cached pods to allocate (KAI v0.12.0 keeps "
            "the list made while the eviction was virtual: the job asks for nothing in queue "
            "order, and as a preemptor has no pod to place)",
        edits=(
            # commitEvict makes the status real (IsVirtualStatus false) without going through
            # the job, so the cache (dropped only on a status change) keeps the evicted pods,
            # which no longer count as pods to allocate: the job's request reads 0 in the queue
            # order and its partial job as a preemptor is empty (DEV-14's nil scenario)
            Edit(_JOB_INFO, _INVALIDATE, _go("""
                // KaiRayInvalidateTasksCache drops the cached pods to allocate: kai-ray variant
                // DEV-14.
                func (pgi *PodGroupInfo) KaiRayInvalidateTasksCache() {
                    pgi.invalidateTasksCache()
                }

            """, depth=0) + "\n" + _INVALIDATE),
            Edit(_STATEMENT, "\treclaimee.IsVirtualStatus = false\n", _go("""
                reclaimee.IsVirtualStatus = false
                reclaimeePodGroup.KaiRayInvalidateTasksCache() // kai-ray variant DEV-14
            """)),
        ),
    ),
    Variant(
        name="kai-bug-pipelined-device-count",
        deviation="DEV-08",
        why="an allocated sharer taken off the last device it held gives that device's GPU back "
            "to idle (KAI v0.12.0 counts the devices only pipelined pods hold as taking idle "
            "GPUs, and keeps it)",
        edits=(
            # a device only pipelined pods hold took a releasing GPU (addSharedTaskResources'
            # Pipelined case), not an idle one; counted here as used, it makes the node look full
            # and the GPU of the emptied device is not given back: allocate re-pipelining a gang
            # of fractions left Idle + Releasing below zero
            Edit(_SHARING_NODE_INFO, _USED_GPUS, _go("""
                    // kaiRayPipelinedOnlyGPUs counts the devices only pipelined pods hold (their
                    // memory is all taken from releasing): kai-ray variant DEV-08.
                    func (ni *NodeInfo) kaiRayPipelinedOnlyGPUs() int {
                        count := 0
                        for gpuGroup, used := range ni.UsedSharedGPUsMemory {
                            if used > 0 && used+ni.ReleasingSharedGPUsMemory[gpuGroup] == 0 {
                                count++
                            }
                        }
                        return count
                    }

                """, depth=0) + "\n" + _USED_GPUS),
            Edit(_SHARING_NODE_INFO, _GIVE_BACK_IDLE, _GIVE_BACK_IDLE_DEV08),
        ),
    ),
    Variant(
        name="kai-bug-unevict-other-node",
        deviation="DEV-09",
        why="a pod placed back on the node it was moved from is pipelined there, not unevicted "
            "onto the node it was moved to (KAI v0.12.0 undoes its eviction from that other node)",
        edits=(
            # a pod moved by an earlier statement keeps its Releasing record on the node it left;
            # Pipeline took that record for "evicted from here" and undid the pod's eviction,
            # which is from its new node: the pod went back there, unchecked. Only a pod whose
            # own node is this one is unevicted
            Edit(_STATEMENT, _UNEVICT_HERE, _go("""
                    if foundOnNode && !updateTaskIfExistsOnNode && !isSharedAndMoveToDifferentGPU &&
                        task.NodeName == hostname { // kai-ray variant DEV-09
                """)),
        ),
    ),
    Variant(
        name="kai-bug-kept-reservation",
        deviation="DEV-10",
        why="a pipelined sharer taken off a device whose other sharers are all releasing "
            "gives back the releasing GPU its pipelining took (KAI v0.12.0 does so only for "
            "a device left empty, and a node whose pipelined sharers a discarded scenario "
            "evicted ends a GPU short)",
        edits=(
            # adding a pipelined sharer takes a releasing GPU when the device, without it, has
            # used memory equal to its releasing memory (empty or all releasing); taking it off
            # checks the same equation with the sharer still counted, where its memory sits on
            # the two sides with opposite signs, so it never holds while another sharer stays
            Edit(_SHARING_NODE_INFO,
                 "\t\tif ni.isPipelinedToReleasingGpu(task, gpuGroup) {\n",
                 _go("""
                    // kai-ray variant DEV-10: the device without the sharer, as adding it checks
                    if ni.UsedSharedGPUsMemory[gpuGroup] == ni.ReleasingSharedGPUsMemory[gpuGroup] {
                """, depth=2)),
        ),
    ),
)}


def kai_module_dir() -> pathlib.Path:
    """KAI's source as the harness builds it (the Go module cache's copy, read-only)."""
    done = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", KAI_MODULE], cwd=harness_dir(),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise HarnessMissing(f"`go list -m {KAI_MODULE}` in benchmarks/kai_go failed (run the "
                             f"harness build once to download it):\n{done.stderr}")
    return pathlib.Path(done.stdout.strip())


def apply_edits(root: pathlib.Path, variants: Iterable[Variant]) -> None:
    """Apply each variant's edits to the KAI tree at `root` (written in place); raises
    VariantError naming the variant, file and anchor when an anchor is not there exactly once."""
    for variant in variants:
        for edit in variant.edits:
            path = root / edit.path
            if not path.is_file():
                raise VariantError(f"variant {variant.name}: {edit.path} is not in {root}")
            text = path.read_text()
            count = text.count(edit.old)
            if count != 1:
                raise VariantError(f"variant {variant.name}: {edit.path}: the anchor "
                                   f"{edit.old.strip()!r} occurs {count} times (must be once)")
            path.write_text(text.replace(edit.old, edit.new))


def variant_set(names: Iterable[str]) -> tuple[Variant, ...]:
    """The variants named, in VARIANTS' order (one set, one build, whatever the order given)."""
    wanted = set(names)
    unknown = wanted - set(VARIANTS)
    if unknown:
        raise KeyError(f"unknown KAI variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    return tuple(v for name, v in VARIANTS.items() if name in wanted)


def patched_kai(names: Iterable[str], module: pathlib.Path | None = None) -> pathlib.Path:
    """A copy of KAI's module with the named variants' edits, in the user cache, keyed by the
    module's path (its version) and the edits: made once, reused after."""
    variants = variant_set(names)
    module = module or kai_module_dir()
    key = hashlib.sha1(json.dumps([str(module)] + [[e.path, e.old, e.new] for v in variants
                                                    for e in v.edits]).encode()).hexdigest()[:12]
    dest = cache_dir() / "kai-variants" / f"{'+'.join(v.deviation for v in variants)}-{key}"
    if (dest / "go.mod").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # made aside and renamed: a second process building the same set sees a whole tree or none
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent)) / "kai"
    shutil.copytree(module, tmp)
    for path in [tmp, *tmp.rglob("*")]:  # the module cache's files are read-only
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    try:
        apply_edits(tmp, variants)
        os.rename(tmp, dest)
    except OSError:
        if not (dest / "go.mod").is_file():
            raise
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return dest


def build_variant(names: Iterable[str]) -> pathlib.Path:
    """The harness binary built against KAI with the named variants applied."""
    return build_harness(patched_kai(names))
