"""Edge cases the review of the Rust port found in the Python core, fixed in both: a running pod
on a node the snapshot does not have, float sums added in order (Python 3.12's `sum`
compensates), Gt/Lt values read as Kubernetes reads them."""

from __future__ import annotations

import pytest

from kai_ray.core import fairshare
from kai_ray.core.constraints import Requirement
from kai_ray.core.model import (
    Job,
    Node,
    Pod,
    PodStatus,
    Queue,
    Request,
    ResourceQuota,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.schedule import schedule

# every test here on both cores, each named in its id (tests/core/conftest.py)
pytestmark = pytest.mark.usefixtures("each_core")

OPEN = ResourceQuota(-1, -1, -1)


def test_evicting_a_pod_on_an_unknown_node_frees_nothing_on_the_known_ones() -> None:
    # n1 is full with a high-priority pod; the only victim runs on a node we do not know
    queues = (Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),)
    jobs = (Job("low", "q", 10, (Pod("g", Request(cpu_m=4000), status=PodStatus.RUNNING,
                                     node="ghost"),)),
            Job("np", "q", 200, (Pod("f", Request(cpu_m=8000), status=PodStatus.RUNNING,
                                     node="n1"),)),
            Job("hi", "q", 200, (Pod("p", Request(cpu_m=4000)),)))
    snapshot = Snapshot((Node("n1", 8000, 10**10),), queues, jobs)
    result = schedule(snapshot, SchedulerConfig(), 0.0)
    # (the last node used to get the victim's CPU as releasing, and `p` was pipelined onto it)
    assert result.evictions == [] and result.pipelined == []
    assert result.pods["p"].status == "Pending"
    stale = schedule(snapshot, SchedulerConfig(actions=("stalegangeviction", "allocate")), 0.0)
    assert stale.pods["p"].status == "Pending"


def test_over_quota_weights_are_added_in_order() -> None:
    weights = [0.2, 1 / 3, 2 / 3, 0.3, 2 / 3]
    queues = [fairshare.ShareInput(name=f"q{i}", deserved=0.0, limit=-1.0, weight=w,
                                   request=float(r), created=float(i))
              for i, (w, r) in enumerate(zip(weights, [10, 19, 3, 16, 13], strict=True))]
    fairshare.divide(36.0, queues)
    # what left-to-right addition gives; compensated addition (Python 3.12's sum) gives
    # [5, 9, 3, 6, 13]
    assert [q.fair_share for q in queues] == [5.0, 8.0, 3.0, 7.0, 13.0]


def test_gt_and_lt_read_values_as_kubernetes_does() -> None:
    gt = Requirement("rank", "Gt", ("2",))
    assert gt.matches("n", {"rank": "3"}) and gt.matches("n", {"rank": "+3"})
    # Python's int() would read these; Go's strconv.ParseInt does not
    for label in (" 3", "3_0", "\uff13", "99999999999999999999"):
        assert not gt.matches("n", {"rank": label}), label
    assert Requirement("rank", "Lt", ("-1",)).matches("n", {"rank": "-2"})
