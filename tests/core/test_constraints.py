"""Taints/tolerations and required node affinity: the matching rules (Kubernetes' semantics)
and what `schedule` does with them, including the explanation of a pod that waits."""

from __future__ import annotations

import pytest

from kai_ray.core.constraints import Requirement, Taint, Toleration, affinity_matches, untolerated
from kai_ray.core.model import Job, Node, Pod, Queue, Request, ResourceQuota, Snapshot
from kai_ray.core.schedule import schedule

# every test here on both cores, each named in its id (tests/core/conftest.py)
pytestmark = pytest.mark.usefixtures("each_core")

OPEN = ResourceQuota(-1.0, -1.0, 1.0)
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(("toleration", "tolerated"), [
    (Toleration("nvidia.com/gpu", "Exists"), True),
    (Toleration("nvidia.com/gpu", "Equal", "present"), True),
    (Toleration("nvidia.com/gpu", "Equal", "absent"), False),
    (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), False),
    (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), True),
    (Toleration("", "Exists"), True),  # empty key with Exists: every taint
    (Toleration("", "Equal"), False),
    (Toleration("other", "Exists"), False),
])
def test_toleration_rules(toleration, tolerated):
    assert toleration.tolerates(GPU_TAINT) is tolerated
    assert (untolerated((GPU_TAINT,), (toleration,)) is None) is tolerated


def test_prefer_no_schedule_does_not_keep_pods_off():
    assert untolerated((Taint("soft", "", "PreferNoSchedule"),), ()) is None
    assert untolerated((Taint("soft", "", "PreferNoSchedule"), GPU_TAINT), ()) == GPU_TAINT


@pytest.mark.parametrize(("requirement", "matches"), [
    (Requirement("zone", "In", ("a", "b")), True),
    (Requirement("zone", "In", ("c",)), False),
    (Requirement("zone", "NotIn", ("c",)), True),
    (Requirement("missing", "NotIn", ("c",)), True),
    (Requirement("zone", "Exists"), True),
    (Requirement("missing", "Exists"), False),
    (Requirement("missing", "DoesNotExist"), True),
    (Requirement("gpus", "Gt", ("4",)), True),
    (Requirement("gpus", "Lt", ("4",)), False),
    (Requirement("zone", "Gt", ("4",)), False),  # not a number: no match
    (Requirement("metadata.name", "In", ("n1",), field=True), True),
    (Requirement("metadata.name", "NotIn", ("n1",), field=True), False),
    (Requirement("zone", "Sometimes", ("a",)), False),
])
def test_requirement_rules(requirement, matches):
    assert requirement.matches("n1", {"zone": "a", "gpus": "8"}) is matches


def test_terms_are_ored_and_requirements_anded():
    in_a = Requirement("zone", "In", ("a",))
    in_b = Requirement("zone", "In", ("b",))
    has_gpu = Requirement("gpu", "Exists")
    labels = {"zone": "b"}
    assert affinity_matches(((in_a,), (in_b,)), "n", labels)
    assert not affinity_matches(((in_b, has_gpu),), "n", labels)
    assert not affinity_matches(((),), "n", labels)  # an empty term matches nothing
    assert not affinity_matches((), "n", labels)


def _cluster(pods_by_job: dict[str, tuple[Pod, ...]]) -> Snapshot:
    nodes = (Node("a-tainted", 16_000, 64 * 10**9, gpus=4, taints=(GPU_TAINT,),
                  labels=(("zone", "a"),)),
             Node("b-plain", 16_000, 64 * 10**9, gpus=1, labels=(("zone", "b"),)))
    queues = (Queue("root", gpu=OPEN, cpu=OPEN, memory=OPEN),
              Queue("q", parent="root", gpu=OPEN, cpu=OPEN, memory=OPEN))
    jobs = tuple(Job(name=name, queue="q", priority=100, pods=pods, min_member=len(pods),
                     created=float(i)) for i, (name, pods) in enumerate(pods_by_job.items()))
    return Snapshot(nodes=nodes, queues=queues, jobs=jobs)


def _one_gpu(name: str, **kwargs: object) -> Pod:
    return Pod(name, Request(cpu_m=1000, memory=10**9, gpus=1), **kwargs)  # type: ignore[arg-type]


def test_untolerated_taint_keeps_a_pod_off_and_says_so():
    result = schedule(_cluster({
        "first": (_one_gpu("first-0"),),
        "second": (_one_gpu("second-0"),),
        "tolerant": (_one_gpu("tolerant-0", tolerations=(Toleration("nvidia.com/gpu",
                                                                   "Exists"),)),)}), now=0.0)
    placed = {b.pod: b.node for b in result.binds}
    assert placed == {"first-0": "b-plain", "tolerant-0": "a-tainted"}
    status = result.job_status["second"]
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in status.message
    assert "1 node(s) didn't have enough resources: GPUs" in status.message


def test_required_affinity_limits_the_nodes():
    anywhere = (Toleration("", "Exists"),)
    on_b = ((Requirement("zone", "In", ("b",)),),)
    result = schedule(_cluster({
        "pinned": (_one_gpu("pinned-0", tolerations=anywhere, node_affinity=on_b),
                   _one_gpu("pinned-1", tolerations=anywhere, node_affinity=on_b)),
        "by-name": (_one_gpu("by-name-0", tolerations=anywhere, node_affinity=(
            (Requirement("metadata.name", "In", ("a-tainted",), field=True),),)),)}), now=0.0)
    assert {b.pod: b.node for b in result.binds} == {"by-name-0": "a-tainted"}
    # the gang of two fits only on zone b, which has one GPU: it waits whole
    assert "didn't match Pod's node affinity/selector" in result.job_status["pinned"].message


def test_a_failed_job_does_not_stand_for_one_with_other_tolerations():
    """Allocate skips a job shaped like one that already failed; tolerations are part of
    the shape (the tolerant job has nodes the other lacks)."""
    result = schedule(_cluster({
        "blocker": (_one_gpu("blocker-0"),),
        "plain": (_one_gpu("plain-0"),),
        "tolerant": (_one_gpu("tolerant-0", tolerations=(Toleration("", "Exists"),)),)}),
        now=0.0)
    assert {b.pod for b in result.binds} == {"blocker-0", "tolerant-0"}
