"""plan_cycle: the cycle's effects worked out from the core's result alone, which it never
edits."""

from kai_ray.controller.plan import BackOff, plan_cycle
from kai_ray.core.model import Job, Pod, PodStatus, Request, Snapshot
from kai_ray.core.result import Bind, CycleResult, Evict
from kai_ray.k8s.suspend import DEMAND_ANNOTATION

NO_BACKOFF = BackOff({}, {})


def _pod(name: str, status: PodStatus, node: str | None = None) -> Pod:
    return Pod(name=name, namespace="ns", request=Request(cpu_m=100), status=status, node=node)


def _job(name: str, *pods: Pod) -> Job:
    return Job(name=name, namespace="ns", queue="q", priority=50, pods=pods,
               min_member=len(pods))


def _pg(name: str, rayjob: bool = False, demand: bool = False) -> dict:
    m: dict = {"name": name, "namespace": "ns", "annotations": {}}
    if rayjob:
        m["ownerReferences"] = [{"kind": "RayJob", "apiVersion": "ray.io/v1", "name": name}]
    if demand:
        m["annotations"][DEMAND_ANNOTATION] = "[]"
    return {"metadata": m}


def _objs(*names: str) -> dict:
    return {f"ns/{n}": {"metadata": {"name": n, "namespace": "ns"}} for n in names}


def _evict(job: str, pod: str) -> Evict:
    return Evict(job, "ns", pod, "n1", "reclaim", "reclaimed")


def test_a_rayjobs_whole_gang_is_suspended_and_a_part_of_one_is_evicted() -> None:
    whole = _job("rj", _pod("rj-0", PodStatus.RUNNING, "n1"), _pod("rj-1", PodStatus.RUNNING, "n1"))
    part = _job("rj2", _pod("rj2-0", PodStatus.RUNNING, "n1"),
                _pod("rj2-1", PodStatus.RUNNING, "n1"))
    other = _job("rc", _pod("rc-0", PodStatus.RUNNING, "n1"))
    snap = Snapshot(nodes=(), queues=(), jobs=(whole, part, other))
    decided = CycleResult(evictions=[_evict("rj", "rj-0"), _evict("rj", "rj-1"),
                                     _evict("rj2", "rj2-1"), _evict("rc", "rc-0")])
    plan = plan_cycle(decided, snap, {"rj": _pg("rj", rayjob=True),
                                      "rj2": _pg("rj2", rayjob=True), "rc": _pg("rc")},
                      _objs("rj-0", "rj-1", "rj2-0", "rj2-1", "rc-0"), NO_BACKOFF, 0.0)
    assert [s.podgroup["metadata"]["name"] for s in plan.suspensions] == ["rj"]
    assert plan.suspensions[0].pod_keys == {"ns/rj-0", "ns/rj-1"}
    assert plan.suspensions[0].message == "reclaimed"
    # every eviction stays in the result: one whose suspension fails is evicted as decided
    assert len(plan.result.evictions) == 4


def test_stand_in_binds_resume_their_rayjob_and_are_not_bound() -> None:
    """A suspended RayJob's stand-in pods (not in the cluster) that fit: resume it; the binds
    of real pods stay, and the core's own result keeps all of them."""
    snap = Snapshot(nodes=(), queues=(), jobs=(
        _job("rj", _pod("rj-0", PodStatus.PENDING)), _job("new", _pod("new-0", PodStatus.PENDING)),
        _job("grow", _pod("grow-0", PodStatus.RUNNING, "n1"), _pod("grow-1", PodStatus.PENDING))))
    decided = CycleResult(binds=[Bind("rj", "ns", "rj-0", "n1"), Bind("new", "ns", "new-0", "n1"),
                                 Bind("grow", "ns", "grow-1", "n1")])
    plan = plan_cycle(decided, snap, {"rj": _pg("rj", rayjob=True, demand=True),
                                      "new": _pg("new"), "grow": _pg("grow")},
                      _objs("new-0", "grow-0", "grow-1"), NO_BACKOFF, 0.0)
    assert [pg["metadata"]["name"] for pg in plan.resumptions] == ["rj"]
    assert [b.pod for b in plan.result.binds] == ["new-0", "grow-1"]
    assert len(decided.binds) == 3
    # a job with none of its pods placed before starts now (its last-start time is stamped)
    assert plan.starting == {"new"}


def test_a_backing_off_gang_says_so_only_while_its_pods_wait() -> None:
    from kai_ray.core.result import JobStatus

    snap = Snapshot(nodes=(), queues=(), jobs=(_job("g", _pod("a", PodStatus.GATED)),))
    decided = CycleResult(job_status={"g": JobStatus("g", "ns", "NotReady", "gated", ("a",))})
    backoff = BackOff({"ns/a": (100.0, 3)}, {"ns/a": "refused"})
    waiting = plan_cycle(decided, snap, {}, {}, backoff, now=50.0).result.job_status["g"]
    assert waiting.reason == "BindBackOff"
    assert waiting.message == ("1 pod(s) of this gang back off for 40s after a failed bind "
                               "(a: refused)")
    after = plan_cycle(decided, snap, {}, {}, backoff, now=150.0).result.job_status["g"]
    assert after.reason == "NotReady"
