"""The Rust core (native/, `kai_ray_native`) takes the same decisions as the Python core, the
reference: every field of the CycleResult (binds, pipelined pods, evictions and their
messages, every pending job's reason and message, queue numbers, every pod's outcome, stale
stamps) is compared, on the synthetic benchmark clusters, on every conformance case round by
round, and on random clusters (hypothesis) that use what the benchmark does not: subgroups
(some of minimum 0) and replicas, minimums raised on running gangs, taints, selectors and
affinity, gpu-memory and multi-device fractions, releasing and gated pods, queue trees with
limits and missing queues, min runtimes, stale gangs, every placement option. Each packing
policy (`gpu_packing`) is compared the same way: on the benchmark clusters, every conformance
case, and random clusters of several GPU models with pods pinned to them. The first run builds
the module (cargo; cached per version of its sources)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.core import schedule as core_schedule
from kai_ray.core.constraints import Requirement, Taint, Toleration
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
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import schedule
from kai_ray.sim import runner
from kai_ray.sim.scenario import load
from kai_ray.sim.synthetic import busy_cluster, cluster
from kai_ray.testing import native_core

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
# every gpu_packing policy but KAI's own (the default, compared everywhere)
PACKING = tuple(p for p in POLICIES if p != "kai")


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    native_core.use(native_core.build())
    assert core_schedule.native_core(refresh=True) is not None


def _fields(result: CycleResult) -> dict[str, object]:
    out = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    out.pop("action_seconds")
    return out


def assert_same(native: CycleResult, python: CycleResult) -> None:
    a, b = _fields(native), _fields(python)
    for name in b:
        assert a[name] == b[name], f"{name} differs"
        # and alike to the letter: dict orders, ints that stay ints (4 == 4.0, not in repr)
        assert repr(a[name]) == repr(b[name]), f"{name}: same values, written differently"


def both(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    native = schedule(snapshot, config, now, core="native")
    python = schedule(snapshot, config, now, core="python")
    assert_same(native, python)
    return native


@pytest.mark.parametrize(("kind", "size", "seed"),
                         [("issue", 60, 1), ("issue", 150, 2), ("issue", 250, 3), ("busy", 150, 1)])
def test_synthetic_cycles_take_the_same_decisions(kind: str, size: int, seed: int) -> None:
    snapshot = (busy_cluster if kind == "busy" else cluster)(size, seed=seed)
    result = both(snapshot, SchedulerConfig(), 0.0)
    assert result.evictions and result.binds  # the solver ran


@pytest.mark.parametrize("policy", PACKING)
@pytest.mark.parametrize(("kind", "size", "seed"),
                         [("issue", 60, 1), ("issue", 150, 2), ("busy", 150, 1)])
def test_synthetic_cycles_take_the_same_decisions_under_each_packing_policy(
        kind: str, size: int, seed: int, policy: str) -> None:
    snapshot = (busy_cluster if kind == "busy" else cluster)(size, seed=seed)
    result = both(snapshot, SchedulerConfig(gpu_packing=policy), 0.0)
    assert result.evictions and result.binds


def _cases() -> list[object]:
    return [pytest.param(s, id=s.id) for path in sorted(SCENARIOS.glob("*.yaml"))
            for s in load(path) if s.run != "fairshare_only"]


@pytest.mark.parametrize("scenario", _cases())
def test_conformance_cases_same_decisions_every_round(scenario) -> None:  # type: ignore[no-untyped-def]
    outcomes = {}
    for core in ("python", "native"):
        before = core_schedule.set_default_core(core)
        try:
            outcomes[core] = runner.run(scenario)
        finally:
            core_schedule.set_default_core(before)
    native, python = outcomes["native"], outcomes["python"]
    assert len(native.rounds) == len(python.rounds)
    for a, b in zip(native.rounds, python.rounds, strict=True):
        assert_same(a, b)
    assert native.history == python.history
    assert runner.check(scenario, native) == []


@pytest.mark.parametrize("policy", PACKING)
@pytest.mark.parametrize("scenario", _cases())
def test_conformance_cases_same_decisions_under_each_packing_policy(
        scenario, policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The cases' expectations are KAI's: only the two cores are compared here."""
    config_of = runner.config_of
    monkeypatch.setattr(runner, "config_of",
                        lambda s: dataclasses.replace(config_of(s), gpu_packing=policy))
    outcomes = {}
    for core in ("python", "native"):
        before = core_schedule.set_default_core(core)
        try:
            outcomes[core] = runner.run(scenario)
        finally:
            core_schedule.set_default_core(before)
    native, python = outcomes["native"], outcomes["python"]
    assert len(native.rounds) == len(python.rounds)
    for a, b in zip(native.rounds, python.rounds, strict=True):
        assert_same(a, b)
    assert native.history == python.history


def test_native_refuses_what_it_does_not_take() -> None:
    snapshot = cluster(10)
    with pytest.raises(ValueError, match='gpu_packing "nonsense"'):
        schedule(snapshot, SchedulerConfig(gpu_packing="nonsense"), 0.0, core="native")
    # "auto" hands it to the Python core instead, which names the policies it knows
    with pytest.raises(ValueError, match="unknown placement policy 'nonsense'"):
        schedule(snapshot, SchedulerConfig(gpu_packing="nonsense"), 0.0)
    # a fraction of more than one device: packing.PodRequest refuses it, so the Rust core
    # leaves the snapshot to the Python core under a packing policy (and takes it under KAI's)
    big = Job("big", "team-0", 50, (Pod("big-0", Request(cpu_m=100, gpu_fraction_milli=1500)),))
    odd = dataclasses.replace(snapshot, jobs=(*snapshot.jobs, big))
    with pytest.raises(ValueError, match='pod "big-0": a request the packing policies refuse'):
        schedule(odd, SchedulerConfig(gpu_packing="fgd"), 0.0, core="native")
    schedule(odd, SchedulerConfig(), 0.0, core="native")
    twice = dataclasses.replace(snapshot, jobs=snapshot.jobs + snapshot.jobs[-1:])
    with pytest.raises(ValueError, match="two jobs are named"):
        schedule(twice, SchedulerConfig(), 0.0, core="native")
    with pytest.raises(ValueError, match="unknown action"):
        schedule(snapshot, SchedulerConfig(actions=("allocate", "nope")), 0.0, core="native")
    with pytest.raises(ValueError, match="core: expected one of"):
        schedule(snapshot, SchedulerConfig(), 0.0, core="rust")  # type: ignore[arg-type]


def test_inputs_the_review_found() -> None:
    """Unusual input both cores must read alike (found by reviewing the port side by side)."""
    open_ = ResourceQuota(-1, -1, 1)
    one = (Node("n1", 64000, 10**12, gpus=4),)
    job = Job("j", "A", 50, (Pod("p", Request(cpu_m=100, gpus=1)),))
    # a later queue of a name replaces the earlier one, then orphans go: no queue A at all
    queues = (Queue("A", gpu=open_, cpu=open_, memory=open_),
              Queue("A", parent="gone", gpu=open_, cpu=open_, memory=open_))
    result = both(Snapshot(one, queues, (job,)), SchedulerConfig(), 0.0)
    assert result.job_status["j"].reason == "QueueDoesNotExist"
    # a later subgroup of a name replaces the earlier one: the gang needs 2, not 3
    grouped = Job("g", "q", 50, tuple(Pod(f"g{i}", Request(cpu_m=100, gpus=1), subgroup="w")
                                      for i in range(2)),
                  subgroups=(SubGroup("w", 1), SubGroup("w", 2)))
    queue = (Queue("q", gpu=open_, cpu=open_, memory=open_),)
    assert len(both(Snapshot(one, queue, (grouped,)), SchedulerConfig(), 0.0).binds) == 2
    # an empty parent is a root, reported with its "", and reclaim compares the names
    nodes = (Node("n1", 640000, 10**13, gpus=8),
             Node("n2", 640000, 10**13, gpus=2, unschedulable=True))
    for parent in ("", None):
        queues = (Queue("P", gpu=ResourceQuota(1, -1, 1.0), cpu=open_, memory=open_),
                  Queue("a1", parent="P", gpu=ResourceQuota(1, -1, 1.0), cpu=open_, memory=open_),
                  Queue("a2", parent="P", gpu=ResourceQuota(0, -1, 1.0), cpu=open_, memory=open_),
                  Queue("b", parent=parent, gpu=ResourceQuota(1, -1, 1.0), cpu=open_,
                        memory=open_))
        jobs = [Job(f"x{i}", "a2", 100, (Pod(f"x{i}p", Request(cpu_m=100, gpus=1),
                                             status=PodStatus.RUNNING, node="n1"),),
                    created=float(i)) for i in range(4)]
        jobs += [Job(f"v{i}", "b", 50, (Pod(f"v{i}p", Request(cpu_m=100, gpus=1),
                                            status=PodStatus.RUNNING,
                                            node="n1" if i < 4 else "n2"),), created=float(i))
                 for i in range(6)]
        jobs.append(Job("r", "a1", 50, (Pod("rp", Request(cpu_m=100, gpus=1)),), created=100.0))
        result = both(Snapshot(nodes, queues, tuple(jobs)), SchedulerConfig(), 0.0)
        assert result.queues["b"].parent == parent
    # a shared request on fewer than one device is left to the Python core
    odd = Job("o", "q", 50, (Pod("o0", Request(cpu_m=100, gpu_fraction_milli=500,
                                                 fraction_devices=0)),))
    with pytest.raises(ValueError, match="fraction_devices 0"):
        schedule(Snapshot(one, queue, (odd,)), SchedulerConfig(), 0.0, core="native")


def test_a_victim_protected_by_an_earlier_preemption_is_not_taken_again() -> None:
    """Two preemptors of one priority (one victim scope) and an elastic victim inside its
    minimum runtime: the first takes the victim's extra pod, which leaves the victim at its
    gang minimum and so protected; the second must not take its last pod. KAI filters the
    victims afresh for every preemptor; the Rust core kept a scope's members fixed for the
    action (found by the random clusters once the Python core stopped keeping them)."""
    open_ = ResourceQuota(-1, -1, 1)
    node = (Node("n0", 64000, 10**12, gpus=2),)
    queue = (Queue("q", gpu=open_, cpu=open_, memory=open_),)
    one = Request(cpu_m=100, gpus=1)
    victim = Job("x", "q", 50, tuple(Pod(f"x{i}", one, status=PodStatus.RUNNING, node="n0")
                                     for i in range(2)), min_member=1, last_start=0.0)
    first = Job("p1", "q", 100, (Pod("p1-0", one),), created=1.0)
    second = Job("p2", "q", 100, (Pod("p2-0", one),), created=2.0)
    config = dataclasses.replace(SchedulerConfig(), default_preempt_min_runtime_s=5.0)
    result = both(Snapshot(node, queue, (victim, first, second)), config, 1.0)
    assert [e.pod for e in result.evictions] == ["x1"]
    assert [p.pod for p in result.pipelined] == ["p1-0"]
    assert result.pods["p2-0"].status == "Pending"


def test_a_job_that_loses_its_protection_in_an_action_becomes_a_victim() -> None:
    """The other way round: an elastic job at its gang minimum inside its minimum runtime is
    protected until it reclaims a pod above its minimum; a later reclaimer of the same action,
    whose queue's victims were gathered before that, must then find it among them. The Rust
    core asks a scope's rules again about the jobs changed since (`recheck_members`); without
    the jobs that join, y finds no victim it may take (3000 random clusters reached no join).

    y0 goes first (A is starved for it) and takes e1 (E is over its share). A is then no
    longer starved, and PB (priority 100) goes before it: x reclaims d0 from its sibling B2
    (over its share of 0), which leaves PB over its share of 2 (x0, x1 and d1, which does not
    yield). Last, y takes x's pipelined pod x1 back: x is above its minimum now."""
    def gpus(deserved: float, weight: float) -> ResourceQuota:
        return ResourceQuota(deserved, -1, weight)

    open_ = ResourceQuota(-1, -1, 1)
    node = (Node("n0", 64000, 10**12, gpus=5),)
    # over-quota goes by priority first: PB (no weight) keeps its 2, A gets the 5th GPU
    queues = (Queue("A", priority=50, gpu=gpus(1, 1), cpu=open_, memory=open_, created=1.0),
              Queue("PB", priority=100, gpu=gpus(2, 0), cpu=open_, memory=open_, created=2.0),
              Queue("B", parent="PB", gpu=gpus(1, 1), cpu=open_, memory=open_, created=3.0),
              Queue("B2", parent="PB", gpu=gpus(0, 0), cpu=open_, memory=open_, created=4.0),
              Queue("E", priority=50, gpu=gpus(1, 0), cpu=open_, memory=open_, created=5.0))
    one = Request(gpus=1)

    def running(name: str, queue: str, created: float, preemptible: bool | None = None) -> Job:
        return Job(name, queue, 50, (Pod(f"{name}-0", one, status=PodStatus.RUNNING,
                                         node="n0"),), created=created, preemptible=preemptible)

    elastic = Job("x", "B", 50, (Pod("x0", one, status=PodStatus.RUNNING, node="n0"),
                                 Pod("x1", one)), min_member=1, last_start=0.0)
    jobs = (elastic, running("d0", "B2", 1.0), running("d1", "B2", 2.0, preemptible=False),
            running("e0", "E", 3.0), running("e1", "E", 4.0),
            Job("y0", "A", 100, (Pod("y0-0", one),), created=10.0),
            Job("y", "A", 50, (Pod("y-0", one),), created=11.0))
    config = dataclasses.replace(SchedulerConfig(), default_reclaim_min_runtime_s=5.0)
    snapshot = Snapshot(node, queues, jobs)
    python = schedule(snapshot, config, 1.0, core="python")
    assert python.queues["A"].fair_share[2] == 2.0 and python.queues["PB"].fair_share[2] == 2.0
    assert [(e.pod, e.action, e.preemptor) for e in python.evictions] == [
        ("d0-0", "reclaim", "x"), ("e1-0", "reclaim", "y0")]
    assert [p.pod for p in python.pipelined] == ["y0-0", "y-0"]
    assert python.pods["x0"].status == "Running" and python.pods["x1"].status == "Pending"
    assert_same(schedule(snapshot, config, 1.0, core="native"), python)


def test_a_reclaim_decided_by_an_exact_ratio_tie() -> None:
    """Reclaim's saturation rule rejects when the reclaimer's parent, with the request, is as
    saturated as a sibling (`mine_ratio * mult >= sib_ratio`): here 3/2 against 6/4. Random
    clusters almost never tie exactly (a `>` in one core alone went unseen by them)."""
    def weightless(quota: float) -> ResourceQuota:
        return ResourceQuota(quota, -1, 0.0)  # no over-quota weight: min(quota, request)

    open_ = ResourceQuota(-1, -1, 0.0)
    nodes = (Node("n0", 64000, 10**12, gpus=8), Node("n1", 64000, 10**12, gpus=1))
    queues = (Queue("P", gpu=weightless(2), cpu=open_, memory=open_),
              Queue("a", parent="P", gpu=weightless(2), cpu=open_, memory=open_, created=1.0),
              Queue("b", parent="P", gpu=weightless(0), cpu=open_, memory=open_, created=2.0),
              Queue("V", gpu=weightless(4), cpu=open_, memory=open_, created=3.0))
    one = Request(gpus=1)
    jobs = [Job(f"b{i}", "b", 100, (Pod(f"b{i}p", one, status=PodStatus.RUNNING, node="n0"),))
            for i in range(2)]
    jobs += [Job(f"v{i}", "V", 50, (Pod(f"v{i}p", one, status=PodStatus.RUNNING,
                                        node="n0" if i < 6 else "n1"),), created=float(i))
             for i in range(7)]
    jobs.append(Job("r", "a", 50, (Pod("rp", one),), created=100.0))
    result = both(Snapshot(nodes, queues, tuple(jobs)), SchedulerConfig(), 0.0)
    assert result.queues["P"].fair_share[2] == 2.0 and result.queues["V"].fair_share[2] == 4.0
    assert result.evictions == [] and result.pods["rp"].status == "Pending"


def test_other_threads_run_during_the_cycle() -> None:
    """The Rust cycle releases the GIL: `kai-ray run`'s other threads (pod grouper, leader
    election, webhook) keep running. A binding holding it stalls a thread beating every
    millisecond for nearly the whole call (this fails then); released, the thread waits only
    while the snapshot is read and the result built."""
    snapshot = cluster(2000)
    schedule(snapshot, SchedulerConfig(), 0.0, core="native")  # memory faulted in once
    stamps: list[float] = []
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=beat)
    thread.start()
    time.sleep(0.05)
    start = time.perf_counter()
    schedule(snapshot, SchedulerConfig(), 0.0, core="native")
    end = time.perf_counter()
    stop.set()
    thread.join()
    inside = [s for s in stamps if start <= s <= end]
    stall = max(b - a for a, b in zip([start, *inside], [*inside, end], strict=True))
    took = end - start
    assert stall < took / 2, f"a thread stalled {stall:.3f} s of a {took:.3f} s cycle"


def test_a_missing_native_core_is_looked_for_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without the module, "auto" runs the Python core and does not retry the import every
    cycle; asking for "native" looks again (it may have been put on sys.path since)."""
    tried: list[str] = []

    def missing(name: str) -> object:
        tried.append(name)
        raise ImportError(name)

    monkeypatch.setattr(core_schedule.importlib, "import_module", missing)
    monkeypatch.setattr(core_schedule, "_CHOICE", core_schedule._Choice())
    snapshot = cluster(5)
    for now in (0.0, 1.0, 2.0):
        assert_same(schedule(snapshot, SchedulerConfig(), now),
                    schedule(snapshot, SchedulerConfig(), now, core="python"))
    assert tried == ["kai_ray_native"]
    with pytest.raises(RuntimeError, match="not built"):
        schedule(snapshot, SchedulerConfig(), 0.0, core="native")
    assert tried == ["kai_ray_native"] * 2


def test_clock_times_each_action() -> None:
    ticks = iter(range(100))
    result = schedule(cluster(20), SchedulerConfig(), 0.0, clock=lambda: float(next(ticks)),
                      core="native")
    assert result.action_seconds == {a: 1.0 for a in SchedulerConfig().actions}


# ------------------------------------------------------------------ random clusters

OPEN = ResourceQuota(-1, -1, 1)
ZONES = ("a", "b")


@st.composite
def requests(draw):  # type: ignore[no-untyped-def]
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "fraction", "memory", "cpu"]))
    cpu = draw(st.sampled_from([0, 500, 1000, 4000]))
    mem = draw(st.sampled_from([0, 10**9, 4 * 10**9]))
    if kind == "whole":
        return Request(cpu_m=cpu, memory=mem, gpus=draw(st.integers(1, 4)))
    if kind == "fraction":
        return Request(cpu_m=cpu, memory=mem,
                       gpu_fraction_milli=draw(st.sampled_from([200, 250, 300, 500, 700])),
                       fraction_devices=draw(st.sampled_from([1, 1, 1, 2, 3])))
    if kind == "memory":
        return Request(cpu_m=cpu, memory=mem,
                       gpu_memory_mib=draw(st.sampled_from([2000, 8000, 20000])),
                       fraction_devices=draw(st.sampled_from([1, 1, 2])))
    return Request(cpu_m=max(cpu, 100), memory=mem)


TAINTS = (Taint("nvidia.com/gpu", "present"), Taint("dedicated", "ml", "NoExecute"),
          Taint("soft", "x", "PreferNoSchedule"))
TOLERATIONS = ((Toleration("nvidia.com/gpu", "Exists"),),
               (Toleration("dedicated", "Equal", "ml", "NoExecute"),),
               (Toleration(operator="Exists"),))
AFFINITY = (((Requirement("zone", "In", ("a",)),),),
            ((Requirement("zone", "NotIn", ("a",)),), (Requirement("gpu", "Exists"),)),
            ((Requirement("metadata.name", "In", ("n0", "n2"), field=True),),),
            ((Requirement("rank", "Gt", ("1",)),),))


@st.composite
def nodes_of(draw):  # type: ignore[no-untyped-def]
    out = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([0, 2, 4, 4, 8]))
        labels = [("zone", draw(st.sampled_from(ZONES))), ("rank", str(i))]
        if gpus:
            labels.append(("gpu", "yes"))
        rare = draw(st.integers(0, 9))
        out.append(Node(
            name=f"n{i}", cpu_m=draw(st.sampled_from([8000, 16000, 64000])),
            memory=draw(st.sampled_from([32, 64, 256])) * 10**9, gpus=gpus,
            gpu_memory_mib=draw(st.sampled_from([16000, 40000, 81920])),
            gpu_memory_synced=rare != 1, max_pods=draw(st.sampled_from([4, 8, 110])),
            labels=tuple(labels), ready=rare != 2, unschedulable=rare == 3,
            foreign_cpu_m=1000 if rare == 4 else 0, foreign_gpus=1 if rare == 4 and gpus else 0,
            foreign_pods=1 if rare == 4 else 0,
            taints=(draw(st.sampled_from(TAINTS)),) if rare in (5, 6) else ()))
    return tuple(out)


@st.composite
def queues_of(draw):  # type: ignore[no-untyped-def]
    queues = [Queue("root", gpu=ResourceQuota(-1, -1, 1), cpu=OPEN, memory=OPEN)]
    nested = draw(st.booleans())
    if nested:
        queues.append(Queue("dept", parent="root", priority=draw(st.sampled_from([100, 50])),
                            gpu=ResourceQuota(draw(st.sampled_from([-1.0, 4.0])), -1, 1),
                            cpu=OPEN, memory=OPEN, created=0.5))
    leaves = []
    for i in range(draw(st.integers(1, 4))):
        parent = "dept" if nested and i % 2 else "root"
        limit = draw(st.sampled_from([-1.0, -1.0, -1.0, -1.0, 4.0, 8.0, 0.0]))
        quota = draw(st.sampled_from([0.0, 2.0, 4.0, 8.0, -1.0]))
        cpu = draw(st.sampled_from([OPEN, OPEN, OPEN, ResourceQuota(8000, 64000, 1)]))
        if draw(st.integers(0, 3)) == 0:
            quota, limit = int(quota), int(limit)  # as a scenario file may write them
        queues.append(Queue(
            f"q{i}", parent=parent, priority=draw(st.sampled_from([100, 100, 50, 125])),
            gpu=ResourceQuota(quota, limit, draw(st.sampled_from([0.0, 1.0, 2.0]))),
            cpu=cpu, memory=OPEN, created=float(i),
            preempt_min_runtime_s=draw(st.sampled_from([None, None, 0.0, 30.0])),
            reclaim_min_runtime_s=draw(st.sampled_from([None, None, 10.0]))))
        leaves.append(f"q{i}")
    if draw(st.integers(0, 5)) == 0:
        queues.append(Queue("orphan", parent="gone", gpu=OPEN, cpu=OPEN, memory=OPEN))
    if draw(st.integers(0, 5)) == 0:
        queues.append(Queue("loose", parent="", gpu=ResourceQuota(2, -1, 1), cpu=OPEN,
                            memory=OPEN, created=9.0))
        leaves.append("loose")
    return tuple(queues), leaves


@st.composite
def jobs_of(draw, prefix: str, leaves: list[str], t0: float):  # type: ignore[no-untyped-def]
    jobs = []
    for j in range(draw(st.integers(2, 10))):
        name = f"{prefix}{j}"
        queue = draw(st.sampled_from(leaves))
        rare = draw(st.integers(0, 29))
        if rare == 0:
            queue = "missing"
        elif rare == 1:
            queue = "root"  # not a leaf
        # later work outranks earlier more often: preemption
        priority = draw(st.sampled_from([50, 50, 75, 100] if t0 == 0 else [50, 75, 100, 125]))
        constraints: dict[str, object] = {}
        pick = draw(st.integers(0, 9))
        if pick == 0:
            constraints["node_selector"] = (("zone", draw(st.sampled_from(ZONES))),)
        elif pick == 1:
            constraints["tolerations"] = draw(st.sampled_from(TOLERATIONS))
        elif pick == 2:
            constraints["node_affinity"] = draw(st.sampled_from(AFFINITY))
        subgroups: tuple[SubGroup, ...] = ()
        if draw(st.integers(0, 5)) == 0:
            # two podsets; the workers in replicas of two hosts
            heads = 1
            workers = draw(st.sampled_from([2, 4]))
            subgroups = (SubGroup("head", 1), SubGroup("workers", draw(st.sampled_from([0, 2])),
                                                       replica_size=2))
            req = draw(requests())
            pods = [Pod(f"{name}-head", req, created=t0 + j, is_ray_head=True, subgroup="head",
                        **constraints)]  # type: ignore[arg-type]
            pods += [Pod(f"{name}-w{k}", req, created=t0 + j, subgroup="workers",
                         replica=f"{name}-r{k // 2}", **constraints)  # type: ignore[arg-type]
                     for k in range(workers)]
            minimum = heads
        else:
            req = draw(requests())
            size = draw(st.integers(1, 4))
            minimum = draw(st.integers(1, size))
            gated = draw(st.integers(0, 9)) == 0
            pods = [Pod(f"{name}-{k}", req, created=t0 + j + k / 10,
                        status=PodStatus.GATED if gated and k == size - 1 else PodStatus.PENDING,
                        task_priority=draw(st.sampled_from([None, None, 1, 5])),
                        **constraints)  # type: ignore[arg-type]
                    for k in range(size)]
        jobs.append(Job(
            name=name, queue=queue, priority=priority, pods=tuple(pods), min_member=minimum,
            created=t0 + j, subgroups=subgroups,
            preemptible=draw(st.sampled_from([None, None, None, True, False])),
            namespace=draw(st.sampled_from(["default", "team"]))))
    return jobs


@st.composite
def configs(draw):  # type: ignore[no-untyped-def]
    gpu = draw(st.sampled_from(["binpack", "binpack", "spread"]))
    return SchedulerConfig(
        placement=NodePlacement(gpu=gpu, cpu=draw(st.sampled_from(["binpack", "spread"]))),
        gpu_device_order=draw(st.sampled_from([None, None, "gpupack", "gpuspread"])),
        staleness_grace_period_s=draw(st.sampled_from([60.0, 0.0, -1.0])),
        max_consolidation_preemptees=draw(st.sampled_from([16, 1, 0, -1])),
        k_value=draw(st.sampled_from([1.0, 0.5])),
        allow_consolidating_reclaim=draw(st.booleans()),
        reclaimer_saturation_multiplier=draw(st.sampled_from([1.0, 1.5])),
        default_preempt_min_runtime_s=draw(st.sampled_from([0.0, 0.0, 5.0])),
        default_reclaim_min_runtime_s=draw(st.sampled_from([0.0, 5.0])),
        gpu_packing=draw(st.sampled_from(["kai", "kai", "kai", *PACKING])))


def _disturb(snapshot: Snapshot, draw_index: int) -> Snapshot:
    """Some running pods released, succeeded or failed, a gang left below its minimum (stale
    after the grace period), a minimum raised on a running gang (with its record), start times
    set: states a cycle of its own seldom leaves."""
    jobs = []
    for j, job in enumerate(snapshot.jobs):
        pods = list(job.pods)
        running = [i for i, p in enumerate(pods) if p.status == PodStatus.RUNNING]
        mode = (j + draw_index) % 8
        if len(running) > 1 and mode == 5:
            # below its minimum now, not yet stamped stale: the cycle stamps it
            pods[running[-1]] = dataclasses.replace(pods[running[-1]], status=PodStatus.PENDING,
                                                    node=None, gpu_groups=())
            job = dataclasses.replace(job, min_member=max(job.min_member, len(running)))
        elif running and mode == 0:
            pods[running[0]] = dataclasses.replace(pods[running[0]], status=PodStatus.RELEASING)
        elif running and mode == 1:
            pods[running[-1]] = dataclasses.replace(pods[running[-1]], status=PodStatus.SUCCEEDED)
        elif len(running) > 1 and mode == 2:
            pods[running[-1]] = dataclasses.replace(pods[running[-1]], status=PodStatus.FAILED,
                                                    node=None, gpu_groups=())
            job = dataclasses.replace(job, stale_since=0.0)
        elif len(running) > 1 and mode == 7:
            # a spec change raised the minimum of the running gang: the lowest minimum of its
            # run is recorded, and the gang is stale only below that (here: one pod lost)
            pods[running[-1]] = dataclasses.replace(pods[running[-1]], status=PodStatus.PENDING,
                                                    node=None, gpu_groups=())
            job = dataclasses.replace(
                job, min_member=job.min_member + 2, admitted_min_member=job.min_member,
                subgroups=tuple(dataclasses.replace(sg, min_member=sg.min_member + 2,
                                                    admitted_min_member=sg.min_member)
                                for sg in job.subgroups))
        if running and mode == 6:
            # a pod on a node the snapshot does not have (deleted since)
            pods[running[0]] = dataclasses.replace(pods[running[0]], node="gone-node")
        stamp = {3: 0.5, 4: 0.0}.get(mode)
        jobs.append(dataclasses.replace(job, pods=tuple(pods),
                                        last_start=stamp if running else job.last_start))
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_clusters_take_the_same_decisions(data) -> None:  # type: ignore[no-untyped-def]
    nodes = data.draw(nodes_of())
    queues, leaves = data.draw(queues_of())
    config = data.draw(configs())
    first = data.draw(jobs_of("a", leaves, 0.0))
    later = data.draw(jobs_of("b", leaves, 100.0))
    snapshot = Snapshot(nodes, queues, tuple(first))
    result = both(snapshot, config, 0.0)
    snapshot = _disturb(runner.advance(snapshot, result), data.draw(st.integers(0, 7)))
    if data.draw(st.integers(0, 2)) == 0:
        # a leaf gains a child queue: the jobs that run in it are now in a parent queue
        leaf = data.draw(st.sampled_from(leaves))
        sub = Queue(f"{leaf}-sub", parent=leaf, gpu=ResourceQuota(2, -1, 1), cpu=OPEN,
                    memory=OPEN, created=5.0)
        snapshot = dataclasses.replace(snapshot, queues=(*snapshot.queues, sub))
    snapshot = dataclasses.replace(snapshot, jobs=snapshot.jobs + tuple(later))
    now = 1.0
    for _ in range(3):
        result = both(snapshot, config, now)
        snapshot = runner.advance(snapshot, result)
        now += data.draw(st.sampled_from([1.0, 61.0]))


@st.composite
def contended(draw):  # type: ignore[no-untyped-def]
    """A cluster filled by priority-50 work that one queue holds most of, then arrivals that
    outrank it (preempt), belong to queues under their share (reclaim) or fit only if others
    move (consolidation)."""
    nodes = tuple(Node(name=f"n{i}", cpu_m=64000, memory=256 * 10**9,
                       gpus=draw(st.sampled_from([4, 8])),
                       gpu_memory_mib=draw(st.sampled_from([40000, 81920])), max_pods=110)
                  for i in range(draw(st.integers(2, 4))))
    total = sum(n.gpus for n in nodes)
    leaves = [f"q{i}" for i in range(draw(st.integers(2, 3)))]
    queues = (Queue("root", gpu=ResourceQuota(-1, -1, 1), cpu=OPEN, memory=OPEN),
              *(Queue(name, parent="root",
                      gpu=ResourceQuota(total / len(leaves), -1, draw(st.sampled_from([1.0, 2.0]))),
                      cpu=OPEN, memory=OPEN, created=float(i)) for i, name in enumerate(leaves)))

    def request() -> Request:
        kind = draw(st.sampled_from(["whole", "whole", "fraction", "memory"]))
        if kind == "whole":
            return Request(cpu_m=1000, memory=10**9, gpus=draw(st.sampled_from([1, 1, 2, 4])))
        if kind == "fraction":
            return Request(cpu_m=500, memory=10**9,
                           gpu_fraction_milli=draw(st.sampled_from([250, 500, 750])))
        return Request(cpu_m=500, memory=10**9, gpu_memory_mib=20000)

    def job(name: str, queue: str, priority: int, t: float) -> Job:
        req = request()
        size = draw(st.integers(1, 3))
        minimum = draw(st.integers(1, size))
        pods = tuple(Pod(f"{name}-{k}", req, created=t) for k in range(size))
        return Job(name=name, queue=queue, priority=priority, pods=pods, min_member=minimum,
                   created=t)

    heavy = draw(st.sampled_from(leaves))
    first, asked = [], 0.0
    while asked < total * 1.2:
        queue = heavy if draw(st.integers(0, 2)) else draw(st.sampled_from(leaves))
        j = job(f"a{len(first)}", queue, 50, float(len(first)))
        first.append(j)
        r = j.pods[0].request
        asked += len(j.pods) * (r.gpus or r.gpu_fraction_milli / 1000 or 0.25)
    later = [job(f"b{i}", draw(st.sampled_from(leaves)),
                 draw(st.sampled_from([50, 75, 100, 125])), 100.0 + i)
             for i in range(draw(st.integers(2, 6)))]
    config = SchedulerConfig(gpu_device_order=draw(st.sampled_from([None, "gpuspread"])),
                             allow_consolidating_reclaim=draw(st.booleans()),
                             gpu_packing=draw(st.sampled_from(["kai", "kai", *PACKING])))
    return Snapshot(nodes, queues, tuple(first)), later, config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contended(), st.integers(0, 7))
def test_contended_clusters_take_the_same_decisions(case, disturb) -> None:  # type: ignore[no-untyped-def]
    snapshot, later, config = case
    result = both(snapshot, config, 0.0)
    snapshot = _disturb(runner.advance(snapshot, result), disturb)
    snapshot = dataclasses.replace(snapshot, jobs=snapshot.jobs + tuple(later))
    for now in (1.0, 2.0, 63.0):
        result = both(snapshot, config, now)
        snapshot = runner.advance(snapshot, result)


# ------------------------------------------------------------------ packing policies

PRODUCT = "nvidia.com/gpu.product"
PRODUCTS = ("A100", "H100", "L4")


@st.composite
def model_nodes(draw):  # type: ignore[no-untyped-def]
    """Nodes of up to three GPU models (and some without the product label, or without GPUs),
    sized so that devices fill up, share and fragment."""
    out = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 8]))
        labels = [("zone", draw(st.sampled_from(ZONES)))]
        product = draw(st.sampled_from([*PRODUCTS, None]))
        if product is not None:
            labels.append((PRODUCT, product))
        rare = draw(st.integers(0, 11))
        out.append(Node(
            name=f"n{i}", cpu_m=draw(st.sampled_from([8000, 16000, 64000])),
            memory=draw(st.sampled_from([16, 64, 256])) * 10**9, gpus=gpus,
            gpu_memory_mib=draw(st.sampled_from([16000, 40000, 81920])),
            max_pods=draw(st.sampled_from([5, 110, 110])), labels=tuple(labels),
            ready=rare != 1, unschedulable=rare == 2,
            foreign_gpus=1 if rare == 3 and gpus else 0,
            foreign_cpu_m=2000 if rare == 4 else 0))
    return tuple(out)


def _pin(draw) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """A pod's GPU model pin (what packing_policy._pinned_products reads), or none."""
    pick = draw(st.integers(0, 7))
    product = draw(st.sampled_from([*PRODUCTS, "V100"]))  # V100: a model no node has
    if pick == 0:
        return {"node_selector": ((PRODUCT, product),)}
    if pick == 1:
        other = draw(st.sampled_from(PRODUCTS))
        return {"node_affinity": (
            (Requirement(PRODUCT, "In", (product, other)),),
            (Requirement("zone", "In", ("a",)), Requirement(PRODUCT, "In", (other,))))}
    if pick == 2:  # a term without the product: not pinned
        return {"node_affinity": ((Requirement(PRODUCT, "In", (product,)),),
                                  (Requirement("zone", "Exists"),))}
    if pick == 3:
        return {"node_selector": (("zone", draw(st.sampled_from(ZONES))),)}
    return {}


@st.composite
def packing_requests(draw):  # type: ignore[no-untyped-def]
    kind = draw(st.sampled_from(["fraction", "fraction", "fraction", "whole", "whole", "memory",
                                 "multi", "cpu"]))
    cpu = draw(st.sampled_from([0, 500, 2000, 8000]))
    mem = draw(st.sampled_from([0, 10**9, 8 * 10**9]))
    if kind == "fraction":
        return Request(cpu_m=cpu, memory=mem,
                       gpu_fraction_milli=draw(st.sampled_from([100, 250, 300, 500, 700, 900])))
    if kind == "whole":
        return Request(cpu_m=cpu, memory=mem, gpus=draw(st.sampled_from([1, 1, 2, 4, 8])))
    if kind == "memory":
        return Request(cpu_m=cpu, memory=mem, gpu_memory_mib=draw(st.sampled_from([4000, 20000])))
    if kind == "multi":
        return Request(cpu_m=cpu, memory=mem, gpu_fraction_milli=500,
                       fraction_devices=draw(st.sampled_from([2, 3])))
    return Request(cpu_m=max(cpu, 100), memory=mem)


@st.composite
def packing_jobs(draw, prefix: str, leaves: list[str], t0: float):  # type: ignore[no-untyped-def]
    jobs = []
    for j in range(draw(st.integers(2, 12))):
        name = f"{prefix}{j}"
        req = draw(packing_requests())
        pin = _pin(draw)
        size = draw(st.integers(1, 4))
        pods = tuple(Pod(f"{name}-{k}", req, created=t0 + j, **pin)  # type: ignore[arg-type]
                     for k in range(size))
        jobs.append(Job(name=name, queue=draw(st.sampled_from(leaves)),
                        priority=draw(st.sampled_from([50, 50, 75, 100] if t0 else [50])),
                        pods=pods, min_member=draw(st.integers(1, size)), created=t0 + j))
    return jobs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_packing_policies_take_the_same_decisions(data) -> None:  # type: ignore[no-untyped-def]
    """Each packing policy in both cores on random clusters of several GPU models: fractions
    that share and fragment devices, whole GPUs, gpu-memory and multi-device fractions (KAI's
    rules), pods pinned to models (the typical shapes and lookahead's arrival weights), then
    higher-priority arrivals that preempt and pipeline onto releasing devices."""
    nodes = data.draw(model_nodes())
    leaves = ["q0", "q1"]
    quota = data.draw(st.sampled_from([2.0, 8.0]))
    queues = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
              *(Queue(q, parent="root", gpu=ResourceQuota(quota, -1, 1), cpu=OPEN,
                      memory=OPEN, created=float(i)) for i, q in enumerate(leaves)))
    config = SchedulerConfig(
        gpu_packing=data.draw(st.sampled_from(PACKING)),
        placement=NodePlacement(gpu=data.draw(st.sampled_from(["binpack", "binpack", "spread"]))),
        gpu_device_order=data.draw(st.sampled_from([None, "gpuspread"])))
    snapshot = Snapshot(nodes, queues, tuple(data.draw(packing_jobs("a", leaves, 0.0))))
    result = both(snapshot, config, 0.0)
    snapshot = _disturb(runner.advance(snapshot, result), data.draw(st.integers(0, 7)))
    later = data.draw(packing_jobs("b", leaves, 100.0))
    snapshot = dataclasses.replace(snapshot, jobs=snapshot.jobs + tuple(later))
    for now in (1.0, 2.0, 63.0):
        result = both(snapshot, config, now)
        snapshot = runner.advance(snapshot, result)


@st.composite
def tight_clusters(draw):  # type: ignore[no-untyped-def]
    """A few nodes of 1-4 GPUs, up to three queues of small quotas (some with no over-quota
    weight), mostly fractional gangs, some whose selector fits no node: devices fill, share and
    get pipelined past full within a cycle or two. Returns the first snapshot, the jobs that
    arrive later and the config (its actions a subset of the cycle's)."""
    nodes = tuple(Node(f"n{i}", 16000, 64 * 10**9, gpus=draw(st.sampled_from([1, 2, 2, 4])),
                       gpu_memory_mib=draw(st.sampled_from([16000, 40000])),
                       max_pods=draw(st.sampled_from([6, 110])),
                       labels=(("zone", draw(st.sampled_from(ZONES))),))
                  for i in range(draw(st.integers(1, 3))))
    leaves = [f"q{i}" for i in range(draw(st.integers(1, 3)))]
    queues = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
              *(Queue(q, parent="root", cpu=OPEN, memory=OPEN, created=float(i),
                      gpu=ResourceQuota(draw(st.sampled_from([0.0, 1.0, 2.0, -1.0])), -1,
                                        draw(st.sampled_from([0.0, 1.0]))))
                for i, q in enumerate(leaves)))

    def request() -> Request:
        kind = draw(st.sampled_from(["fraction", "fraction", "fraction", "whole", "memory"]))
        if kind == "whole":
            return Request(cpu_m=100, gpus=draw(st.sampled_from([1, 1, 2])))
        if kind == "memory":
            return Request(cpu_m=100, gpu_memory_mib=draw(st.sampled_from([4000, 8000])))
        return Request(cpu_m=100, gpu_fraction_milli=draw(st.sampled_from([200, 250, 300, 500,
                                                                           700])),
                       fraction_devices=draw(st.sampled_from([1, 1, 1, 2])))

    def jobs(prefix: str, t0: float, priorities: list[int]) -> list[Job]:
        out = []
        for j in range(draw(st.integers(2, 8))):
            req, size = request(), draw(st.integers(1, 3))
            pin = {"node_selector": (("zone", "c"),)} if draw(st.integers(0, 4)) == 0 else {}
            pods = tuple(Pod(f"{prefix}{j}-{k}", req, created=t0 + j, **pin)  # type: ignore[arg-type]
                         for k in range(size))
            out.append(Job(f"{prefix}{j}", draw(st.sampled_from(leaves)),
                           draw(st.sampled_from(priorities)), pods,
                           min_member=draw(st.integers(1, size)), created=t0 + j,
                           last_start=draw(st.sampled_from([None, 0.5]))))
        return out

    first, later = jobs("a", 0.0, [50, 50, 75]), jobs("b", 100.0, [50, 75, 100])
    actions = draw(st.sampled_from([SchedulerConfig().actions, ("consolidation", "preempt"),
                                    ("consolidation", "reclaim"), ("reclaim",),
                                    ("allocate", "consolidation", "preempt"),
                                    ("consolidation", "preempt", "reclaim")]))
    config = SchedulerConfig(
        gpu_packing=draw(st.sampled_from(["kai", "kai", "best_fit"])),
        placement=NodePlacement(gpu=draw(st.sampled_from(["binpack", "spread"]))),
        allow_consolidating_reclaim=draw(st.booleans()), actions=actions)
    return Snapshot(nodes, queues, tuple(first)), later, config


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tight_clusters(), st.integers(0, 7))
def test_tight_clusters_take_the_same_decisions(case, disturb) -> None:  # type: ignore[no-untyped-def]
    """Both cores on small crowded clusters: a full cycle, some pods disturbed, more jobs,
    then three cycles of the drawn actions (where a victim order that gains a queue went
    wrong first showed)."""
    snapshot, later, config = case
    result = both(snapshot, dataclasses.replace(config, actions=SchedulerConfig().actions), 0.0)
    snapshot = _disturb(runner.advance(snapshot, result), disturb)
    snapshot = dataclasses.replace(snapshot, jobs=snapshot.jobs + tuple(later))
    for now in (1.0, 2.0, 63.0):
        snapshot = runner.advance(snapshot, both(snapshot, config, now))


def test_a_skipped_job_of_a_sibling_leaf_orders_a_reclaim_scenario() -> None:
    """A victim scenario places its reclaimer and victims again in KAI's job order, among every
    pending job: one that is not placed again is skipped, but while it heads its queue the
    queue is compared by it. r (leaf L2 of P) reclaims s (S) off the only GPU. With big first
    in L (its sibling leaf, higher priority), P is compared by 2 GPUs, over its quota of 1, so
    not starved: S (priority 125) pops first, s takes its GPU back and r stays pending. Without
    big, P is starved for r, r pops first and the reclaim goes through. The Rust core takes
    only the pending jobs that can change the order: a leaf without a wanted job under a
    contested parent gives all of them (`above`; one that gave none went unseen)."""
    def quota(gpus: float) -> ResourceQuota:
        return ResourceQuota(gpus, -1, 1)

    open_ = ResourceQuota(-1, -1, 1)
    node = (Node("n0", 64000, 10**12, gpus=1),)
    queues = (Queue("P", priority=100, gpu=quota(1), cpu=open_, memory=open_, created=1.0),
              Queue("S", priority=125, gpu=quota(0), cpu=open_, memory=open_, created=2.0),
              Queue("L", parent="P", priority=125, gpu=quota(2), cpu=open_, memory=open_,
                    created=3.0),
              Queue("L2", parent="P", priority=100, gpu=quota(1), cpu=open_, memory=open_,
                    created=4.0))
    one = Request(gpus=1)
    victim = Job("s", "S", 50, (Pod("s-0", one, status=PodStatus.RUNNING, node="n0"),))
    reclaimer = Job("r", "L2", 50, (Pod("r-0", one),), created=10.0)
    big = Job("big", "L", 50, (Pod("big-0", Request(gpus=2)),), created=11.0)  # never fits
    alone = both(Snapshot(node, queues, (victim, reclaimer)), SchedulerConfig(), 0.0)
    assert [(e.pod, e.action, e.preemptor) for e in alone.evictions] == [("s-0", "reclaim", "r")]
    assert [p.pod for p in alone.pipelined] == ["r-0"]
    snapshot = Snapshot(node, queues, (victim, reclaimer, big))
    python = schedule(snapshot, SchedulerConfig(), 0.0, core="python")
    assert python.evictions == [] and python.pipelined == [] and python.binds == []
    assert python.pods["s-0"].status == "Running" and python.pods["r-0"].status == "Pending"
    assert_same(schedule(snapshot, SchedulerConfig(), 0.0, core="native"), python)


def test_a_device_pipelined_past_full_gives_no_room() -> None:
    """Consolidation pipelines more sharers onto one idle device than it holds (a2's two 0.7
    pods, a4-1, b8-0 and b8-1 onto n0's fourth GPU: pipelined pods are charged to releasing
    room, which goes below 0). Preempt then looks for room for b8-2 (0.25) on n0, which still
    has a whole GPU free: its first victim, a4-1 (pipelined there), leaves that device's room
    below 0, which counts as none, so the whole free GPU is enough and the scenario that only
    takes a4-1 back and puts it where it was wins: nothing running is evicted. The Rust core
    counted the room below 0 into its total of device room, found too little, skipped that
    scenario and evicted a4-0 (random clusters, seed 6290629364132158843429770859798741801)."""
    def frac(name: str, milli: int, created: float, node: str | None = None,
             device: str = "") -> Pod:
        running = node is not None
        return Pod(name, Request(gpu_fraction_milli=milli),
                   status=PodStatus.RUNNING if running else PodStatus.PENDING, node=node,
                   gpu_groups=(device,) if running else (), created=created)

    zone = {"node_selector": (("zone", "a"),)}
    nodes = (Node("n0", 8000, 16 * 10**9, gpus=4, gpu_memory_mib=16000, labels=(("zone", "a"),)),
             Node("n1", 8000, 16 * 10**9, gpus=1, gpu_memory_mib=16000, max_pods=5))
    queues = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
              Queue("q0", parent="root", gpu=ResourceQuota(2.0, -1, 1), cpu=OPEN, memory=OPEN),
              Queue("q1", parent="root", gpu=ResourceQuota(2.0, -1, 1), cpu=OPEN, memory=OPEN,
                    created=1.0))
    jobs = (
        Job("a0", "q0", 50, (frac("a0-0", 500, 0.0, "n1", "n1-gpu-1"),)),
        Job("a2", "q0", 50, (frac("a2-0", 700, 2.0, "n0", "n0-gpu-1"),
                             frac("a2-1", 700, 2.0, "n0", "n0-gpu-2")), min_member=2,
            created=2.0),
        Job("a4", "q0", 50, (frac("a4-0", 500, 4.0, "n1", "n1-gpu-1"), frac("a4-1", 500, 4.0)),
            created=4.0, last_start=0.5),
        Job("b0", "q1", 50, tuple(Pod(f"b0-{i}", Request(gpus=1), created=100.0, **zone)
                                  for i in range(2)), min_member=2, created=100.0),
        Job("b8", "q0", 75, tuple(Pod(f"b8-{i}", Request(gpu_fraction_milli=250),
                                      created=108.0, **zone) for i in range(3)),
            min_member=2, created=108.0))
    config = SchedulerConfig(gpu_packing="best_fit", placement=NodePlacement(gpu="binpack"),
                             actions=("consolidation", "preempt"))
    python = schedule(Snapshot(nodes, queues, jobs), config, 1.0, core="python")
    assert [(e.pod, e.action) for e in python.evictions] == [
        ("a2-0", "consolidation"), ("a2-1", "consolidation")]
    assert python.pods["a4-0"].status == "Running"
    assert python.pods["b8-2"].status == "Pipelined" and python.pods["b8-2"].node == "n0"
    assert_same(schedule(Snapshot(nodes, queues, jobs), config, 1.0, core="native"), python)


def test_a_victim_order_that_gains_a_second_queue_is_not_carried_over() -> None:
    """Reclaim, q0's jobs first: a2 (whose selector fits no node) searches while only a3 (q1)
    has a victim, so the scope's victim order holds one queue. a4 (q2) then gets room, and
    its pipelined pod is a victim too: for b0 the order is between two queues, and the spec
    takes a4-0 first (q2 holds nothing yet: a pipelined pod counts nothing), moves it to n0 and
    puts b0-0 there. The Rust core carried its one-queue order over by merging a4's unit in
    by job order, took a3-1 first, and on a3-0's node (none: pending) placed b0-0 with no
    victim, leaving a4-0 on n1 (found by an independent review's generator)."""
    def pod(name: str, req: Request, created: float, **more: object) -> Pod:
        return Pod(name, req, created=created, **more)  # type: ignore[arg-type]

    frac = Request(cpu_m=100, gpu_fraction_milli=200)
    mem = Request(cpu_m=100, gpu_memory_mib=4000)
    zone_a = {"node_selector": (("zone", "a"),)}
    nodes = tuple(Node(n, 16000, 64 * 10**9, gpus=1, gpu_memory_mib=16000, max_pods=6,
                       labels=(("zone", "b"),)) for n in ("n0", "n1"))
    queues = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
              *(Queue(q, parent="root", gpu=ResourceQuota(1.0, -1, 1), cpu=OPEN, memory=OPEN,
                      created=float(i)) for i, q in enumerate(("q0", "q1", "q2"))))
    jobs = (
        Job("a2", "q0", 50, (pod("a2-0", frac, 2.0, **zone_a),), created=2.0),
        Job("a3", "q1", 50, (pod("a3-0", mem, 3.0),
                             pod("a3-1", mem, 3.0, status=PodStatus.RUNNING, node="n0",
                                 gpu_groups=("n0-gpu-1",))), created=3.0),
        Job("a4", "q2", 75, (pod("a4-0", frac, 4.0),), created=4.0),
        Job("a5", "q0", 50, (pod("a5-0", Request(cpu_m=100, gpus=1), 5.0, **zone_a),),
            created=5.0),
        Job("b0", "q0", 50, (pod("b0-0", frac, 100.0),), created=100.0))
    config = SchedulerConfig(placement=NodePlacement(gpu="spread"), actions=("reclaim",))
    snapshot = Snapshot(nodes, queues, jobs)
    python = schedule(snapshot, config, 63.0, core="python")
    assert [(p.pod, p.node) for p in python.pipelined] == [("a4-0", "n0"), ("b0-0", "n0")]
    assert python.evictions == []
    assert_same(schedule(snapshot, config, 63.0, core="native"), python)


def test_a_job_left_in_a_parent_queue_is_never_a_victim() -> None:
    """A walk of the queue tree reads only leaves' heaps, so a running job whose queue has
    children is never popped as a victim. The Rust core's pop shortcuts (one heap, or one heap
    left holding items) checked only that the queue was in the tree, and reclaimed it (found by
    review; the old build fails here: 'pipelined differs')."""
    open_ = ResourceQuota(-1, -1, 1)

    def queue(name: str, gpus: float, parent: str | None = None) -> Queue:
        return Queue(name, parent=parent, gpu=ResourceQuota(gpus, -1, 1), cpu=open_,
                     memory=open_, created=float(len(name)))

    one = Request(gpus=1)
    queues = (queue("P", 0), queue("A", 0, parent="P"), queue("C", 0), queue("B", 2))
    parked = Job("v", "P", 50, (Pod("v-0", one, status=PodStatus.RUNNING, node="n0"),))
    # the only victim: one heap
    alone = both(Snapshot((Node("n0", 64000, 10**12, gpus=1),), queues,
                          (parked, Job("r", "B", 50, (Pod("r-0", one),), created=10.0))),
                 SchedulerConfig(), 0.0)
    assert alone.evictions == [] and alone.pipelined == []
    # the victim left after another queue's: the one heap still holding items
    other = Job("w", "C", 50, (Pod("w-0", one, status=PodStatus.RUNNING, node="n0"),))
    gang = Job("r", "B", 50, tuple(Pod(f"r-{i}", one) for i in range(2)), created=10.0)
    two = both(Snapshot((Node("n0", 64000, 10**12, gpus=2),), queues, (parked, other, gang)),
               SchedulerConfig(), 0.0)
    assert [e.pod for e in two.evictions] == ["w-0"]
