"""The packing policies drive the live core when configured (not only the trace benchmark)."""

import dataclasses

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

OPEN = ResourceQuota(-1, -1, 1)


def _snapshot():
    nodes = (Node("a", 64000, 256 * 2**30, 2), Node("b", 64000, 256 * 2**30, 2))
    running = Job("run", "q", 50, (Pod("run-0", Request(1000, 2**30, gpu_fraction_milli=600),
                                       status=PodStatus.RUNNING, node="b",
                                       gpu_groups=("b-dev",)),))
    pending = Job("new", "q", 50, (Pod("new-0", Request(1000, 2**30, gpu_fraction_milli=400)),),
                  created=1.0)
    return Snapshot(nodes, (Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),), (running, pending))


def test_every_policy_places_and_never_overcommits():
    for policy in ("kai", "best_fit", "packing", "fgd", "lookahead"):
        config = dataclasses.replace(SchedulerConfig(), gpu_packing=policy)
        result = schedule(_snapshot(), config, 0.0)
        bind = next(b for b in result.binds if b.pod == "new-0")
        # 0.4 fits next to the running 0.6 exactly; every packing policy fills that device
        assert (bind.node, bind.gpu_groups) == ("b", ("b-dev",)), policy


def test_unknown_policy_fails_loudly():
    config = dataclasses.replace(SchedulerConfig(), gpu_packing="nonsense")
    try:
        schedule(_snapshot(), config, 0.0)
    except ValueError as e:
        assert "nonsense" in str(e)
    else:
        raise AssertionError("an unknown policy must be refused")
