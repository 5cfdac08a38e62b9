"""The scheduling loop's threads and timing: the pod grouper beside the cycles (new pods at once,
otherwise one pass per cycle period, nothing while not the leader), and bound pods staying
assumed after a bind phase longer than the assume window; a plan written through the writers the
loop is handed."""

from __future__ import annotations

import threading
import time

from kubernetes import client

from kai_ray.controller.plan import BackOff, CyclePlan, Suspension, plan_cycle
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop, Writers


class _Cache:
    def __init__(self) -> None:
        self.dirty_pods: set[str] = set()
        self.pods_to_group = threading.Event()


class _Grouper:
    def __init__(self, cache: _Cache) -> None:
        self.cache = cache
        self.passes: list[float] = []

    def run_once(self) -> int:
        self.passes.append(time.monotonic())
        self.cache.pods_to_group.clear()
        n = len(self.cache.dirty_pods)
        self.cache.dirty_pods = set()
        return n


def _run(period: float, seconds: float, leader: bool = True,
         new_pod_at: float | None = None) -> tuple[_Grouper, float | None]:
    cache = _Cache()
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), cache,  # type: ignore[arg-type]
                         LoopConfig(period_s=period))
    grouper = _Grouper(cache)
    loop.grouper = grouper
    t = threading.Thread(target=loop._group_forever, args=(lambda: leader,), daemon=True)
    t.start()
    added = None
    if new_pod_at is not None:
        time.sleep(new_pod_at)
        added = time.monotonic()
        cache.dirty_pods.add("ns/new")
        cache.pods_to_group.set()
        time.sleep(seconds - new_pod_at)
    else:
        time.sleep(seconds)
    loop.stop()
    t.join(2)
    return grouper, added


def test_idle_grouper_passes_once_per_period() -> None:
    grouper, _ = _run(period=0.5, seconds=1.6)
    assert 3 <= len(grouper.passes) <= 5  # not every 0.1 s idle tick


def test_a_new_pod_is_grouped_without_waiting_for_the_period() -> None:
    grouper, added = _run(period=5.0, seconds=1.0, new_pod_at=0.5)
    assert added is not None
    later = [t for t in grouper.passes if t >= added]
    assert later and later[0] - added < 0.5


def test_stop_wakes_a_waiting_grouper() -> None:
    cache = _Cache()
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), cache,  # type: ignore[arg-type]
                         LoopConfig(period_s=60.0))
    loop.grouper = _Grouper(cache)
    t = threading.Thread(target=loop._group_forever, args=(None,), daemon=True)
    t.start()
    time.sleep(0.2)
    loop.stop()
    t.join(2)
    assert not t.is_alive() and len(loop.grouper.passes) == 1


def test_a_standby_does_not_group() -> None:
    grouper, _ = _run(period=0.2, seconds=0.8, leader=False)
    assert grouper.passes == []


class _SlowBinder:
    """Binds that take longer than the assume window."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last_bound: set[str] = set()
        self.gave_up: dict[str, str] = {}

    def apply_binds(self, result: object, *args: object) -> int:
        time.sleep(self.seconds)
        self.last_bound = {f"{b.namespace}/{b.pod}" for b in result.binds}  # type: ignore[attr-defined]
        return len(self.last_bound)

    def evict(self, *args: object) -> bool:
        return False

    def collect_reservations(self, *args: object) -> int:
        return 0


class _NoStatus:
    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def test_bound_pods_stay_assumed_after_a_long_bind_phase(monkeypatch) -> None:
    """A bind phase longer than the assume window must not leave its pods unassumed: the next
    cycle would decide them again."""
    from kai_ray.controller import scheduler_loop
    from kai_ray.core.model import PodStatus
    from kai_ray.core.result import Bind, CycleResult

    monkeypatch.setattr(scheduler_loop, "ASSUME_SECONDS", 0.3)
    cache = _Cache()
    cache.queues = {}  # type: ignore[attr-defined]
    writers = Writers(_SlowBinder(0.5), _NoStatus(), _NoStatus())  # type: ignore[arg-type]
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), cache,  # type: ignore[arg-type]
                         LoopConfig(), writers=writers)
    result = CycleResult(binds=[Bind(job="j", namespace="ns", pod="p", node="n1")])
    loop._carry_out(CyclePlan(result, (), (), frozenset()), {}, {}, [])
    assumed = loop.assumed["ns/p"]
    assert assumed.status == PodStatus.BOUND and assumed.until > time.monotonic()


class _Recorder:
    """A fake writer: records each call by name, answers `answer` (binder: `last_bound`,
    `gave_up`, `provisional` and `fence` as the loop reads and sets them)."""

    def __init__(self, calls: list[str], answer: object = True) -> None:
        self.calls, self.answer = calls, answer
        self.last_bound: set[str] = set()
        self.gave_up: dict[str, str] = {}
        self.provisional = None

    def __getattr__(self, name: str) -> object:
        def call(*args: object) -> object:
            self.calls.append(name if name != "evict" else f"evict {args[0]['metadata']['name']}")
            return self.answer
        return call


def test_a_plan_is_written_in_order_through_the_writers_the_loop_is_handed() -> None:
    """The loop writes with the writers it is given (fakes here, no API server) and wires its
    fence into the binder it is given. A plan's writes go in order: the RayJob suspended first
    (its pod's eviction is then not sent), the other evictions, the binds, then status."""
    from kai_ray.core.result import Bind, CycleResult, Evict

    calls: list[str] = []
    binder, status, suspender = _Recorder(calls), _Recorder(calls), _Recorder(calls)
    cache = _Cache()
    cache.queues = {}  # type: ignore[attr-defined]
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), cache,  # type: ignore[arg-type]
                         LoopConfig(), writers=Writers(binder, status, suspender))  # type: ignore[arg-type]
    assert binder.fence == loop.fence  # type: ignore[attr-defined]
    pod = {"metadata": {"name": "a-0", "namespace": "ns"}}
    other = {"metadata": {"name": "b-0", "namespace": "ns"}}
    gone = Evict("a", "ns", "a-0", "n1", "reclaim", "reclaimed")
    result = CycleResult(binds=[Bind(job="c", namespace="ns", pod="c-0", node="n1")],
                         evictions=[gone, Evict("b", "ns", "b-0", "n2", "preempt", "preempted")])
    suspension = Suspension({"metadata": {"name": "a"}}, (pod,), "suspended", (gone,))
    loop._carry_out(CyclePlan(result, (suspension,), (), frozenset()), {},
                    {"ns/a-0": pod, "ns/b-0": other}, [])
    assert calls == ["suspend", "evict b-0", "apply_binds", "pending", "clear_scheduled",
                     "stale", "queues", "collect_reservations"]


def test_a_gang_backing_off_says_so_not_that_it_waits_for_gated_pods() -> None:
    from kai_ray.core.model import Job, Pod, PodStatus, Request, Snapshot
    from kai_ray.core.result import CycleResult, JobStatus

    loop = SchedulerLoop(client.ApiClient(client.Configuration()), _Cache(),  # type: ignore[arg-type]
                         LoopConfig())
    pods = tuple(Pod(name=n, namespace="ns", request=Request(cpu_m=100),
                     status=PodStatus.PENDING) for n in ("a", "b"))
    snapshot = Snapshot(nodes=(), queues=(), jobs=(Job(name="g", namespace="ns", queue="q",
                                                       priority=0, pods=pods, min_member=2),))
    loop._back_off({"ns/a": "binding to node n1 was refused 5 times, last: 422 no"})
    waiting = loop._apply_assumed(snapshot, {f"ns/{p.name}": {"spec": {}} for p in pods})
    assert [p.status for p in waiting.jobs[0].pods] == [PodStatus.GATED, PodStatus.PENDING]
    decided = CycleResult()
    decided.job_status["g"] = JobStatus("g", "ns", "NotReady", "... 1 are gated", ("b",))

    def planned() -> JobStatus:
        plan = plan_cycle(decided, waiting, {}, {}, BackOff(loop.backoff, loop._backoff_why),
                          time.monotonic())
        return plan.result.job_status["g"]

    status = planned()
    assert status.reason == "BindBackOff" and status.pending_pods == ("b",)
    assert "1 pod(s) of this gang back off for 10s" in status.message
    assert "a: binding to node n1 was refused 5 times" in status.message
    assert decided.job_status["g"].reason == "NotReady"  # the core's result is left as it was
    loop._back_off({"ns/a": "again"})  # a second give-up doubles it
    assert "back off for 20s" in planned().message


class _SlowGrouper(_Grouper):
    """Its passes take `seconds` each; it holds what `run` sets on a grouper."""

    def __init__(self, cache: _Cache, seconds: float) -> None:
        super().__init__(cache)
        self.seconds = seconds
        self.defer_bare_pods = False
        self.ended: list[float] = []

    def run_once(self) -> int:
        time.sleep(self.seconds)
        self.ended.append(time.monotonic())
        return super().run_once()

    def create_after_bind(self, podgroup: object) -> None:
        pass

    def flush_after_binds(self) -> None:
        pass


class _CountingLoop(SchedulerLoop):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.cycles: list[float] = []

    def cycle(self) -> None:  # type: ignore[override]
        self.cycles.append(time.monotonic())
        self.stop()


def _first_cycle(pass_s: float, wait_s: float) -> tuple[_SlowGrouper, _CountingLoop]:
    cache = _Cache()
    cache.changed = threading.Event()  # type: ignore[attr-defined]
    loop = _CountingLoop(client.ApiClient(client.Configuration()), cache,
                         LoopConfig(period_s=60.0, first_grouping_wait_s=wait_s))
    grouper = _SlowGrouper(cache, pass_s)
    loop.grouper = grouper  # type: ignore[assignment]
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    runner.join(10)
    assert not runner.is_alive()
    return grouper, loop


def test_the_first_cycle_waits_for_the_groupers_first_pass() -> None:
    """The pods pending at start are decided in one cycle: the first waits for the grouper."""
    grouper, loop = _first_cycle(pass_s=0.5, wait_s=5.0)
    assert loop.cycles and grouper.ended and loop.cycles[0] >= grouper.ended[0]


def test_a_slow_first_pass_does_not_hold_the_first_cycle_for_long() -> None:
    grouper, loop = _first_cycle(pass_s=3.0, wait_s=0.3)
    assert loop.cycles and (not grouper.ended or loop.cycles[0] < grouper.ended[0])
