"""The packing policies drive the live core when configured (not only the trace benchmark)."""

import dataclasses

import pytest

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


def test_typical_shapes_keep_a_pods_gpu_model_pin():
    """A pod pinned to a GPU model (node selector on nvidia.com/gpu.product) counts only for
    that model's nodes in the typical shapes, as gpu_spec does in the trace; a pin to a model
    the cluster lacks leaves the pod out."""
    from kai_ray.core import packing_policy
    from kai_ray.core.state import Session

    product = "nvidia.com/gpu.product"
    nodes = (Node("a", 64000, 256 * 2**30, 2, labels=((product, "A100"),)),
             Node("b", 64000, 256 * 2**30, 2, labels=((product, "V100"),)))
    pods = (Pod("free", Request(1000, 2**30, gpu_fraction_milli=500)),
            Pod("pinned", Request(2000, 2**30, gpus=1), node_selector=((product, "V100"),)),
            Pod("nowhere", Request(3000, 2**30, gpus=2), node_selector=((product, "H100"),)),
            # the same pin as required node affinity: one term with an In on the product
            Pod("by-affinity", Request(4000, 2**30, gpus=1), node_affinity=(
                (Requirement(product, "In", ("A100", "H100")),),)),
            # a term without the product label lets the pod go anywhere: not pinned
            Pod("loose", Request(5000, 2**30, gpus=1), node_affinity=(
                (Requirement(product, "In", ("A100",)),), (Requirement("zone", "Exists"),))))
    jobs = tuple(Job(p.name, "q", 50, (p,)) for p in pods)
    sess = Session(Snapshot(nodes, (Queue("q", gpu=OPEN, cpu=OPEN, memory=OPEN),), jobs),
                   SchedulerConfig(), 0.0)
    shapes = packing_policy.typical(sess)
    assert shapes is not None
    rows = {int(cpu): [bool(x) for x in shapes.allowed[i]]
            for i, cpu in enumerate(shapes.cpu_milli)}
    model = packing_policy._model_ids(sess)[1]
    assert rows[1000] == [True, True]
    assert rows[2000] == [m == model["V100"] for m in range(2)]
    assert 3000 not in rows
    assert rows[4000] == [m == model["A100"] for m in range(2)]
    assert rows[5000] == [True, True]
