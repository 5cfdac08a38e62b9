"""Crash safety: `kai-ray run` is SIGKILLed at random moments while 50 gangs are being bound,
then restarted. After convergence every gang is whole or entirely unbound and no node has more
GPUs bound than it has. Runs on a control plane of its own (the shared scheduler must not
interfere)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from kubernetes import client

from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.helpers import create_queues, gang, pool_nodes, queue, wait_for

pytestmark = pytest.mark.integration

GANGS, GANG_SIZE, NODES, GPUS = 50, 4, 20, 8  # 200 GPUs asked for, 160 exist: 40 gangs fit
REPEATS = 10


def _bound_by_gang(core: client.CoreV1Api, ns: str) -> tuple[Counter, Counter]:
    gangs: Counter = Counter()
    per_node: Counter = Counter()
    for p in core.list_namespaced_pod(ns).items:
        if p.spec.node_name:
            gangs[p.metadata.annotations["pod-group-name"]] += 1
            per_node[p.spec.node_name] += 1
    return gangs, per_node


def test_sigkill_never_leaves_a_partial_gang(plane, tmp_path):
    api = plane.api_client()
    core = client.CoreV1Api(api)
    rng = random.Random(20261122)
    create_queues(api, queue("crash-root"), queue("crash", "crash-root"))
    partial_at_kill = 0  # kills that hit the middle of a gang's binds
    for rep in range(REPEATS):
        pool, _ = pool_nodes(api, NODES, GPUS, pool=f"crash{rep}")
        ns = f"crash-{rep}"
        core.create_namespace({"metadata": {"name": ns}})
        plane.wait_service_account(ns)
        for g in range(GANGS):
            gang(api, ns, f"g{g}", "crash", GANG_SIZE, gpus=1,
                 node_selector={"kai-ray.io/pool": pool})
        proc = KaiRayProcess(plane.kubeconfig, tmp_path / f"rep{rep}",
                             ["--leader-election", "off"])  # handover is tested elsewhere
        (tmp_path / f"rep{rep}").mkdir()
        kills = 0
        for _ in range(2):  # two crashes per repetition, at random moments of the binding
            proc.start()
            proc.wait_ready()
            time.sleep(rng.uniform(0.2, 3.0))
            proc.kill()
            kills += 1
            gangs, _ = _bound_by_gang(core, ns)
            partial_at_kill += sum(1 for n in gangs.values() if 0 < n < GANG_SIZE)
        proc.start()
        try:
            fit = NODES * GPUS // GANG_SIZE

            def converged(ns: str = ns, fit: int = fit) -> bool:
                gangs, _ = _bound_by_gang(core, ns)
                return sum(1 for n in gangs.values() if n == GANG_SIZE) == fit

            wait_for(f"repetition {rep}: {fit} whole gangs bound after {kills} crashes",
                     converged, timeout=120, detail=proc.log_tail)
            time.sleep(2)  # a few more cycles: nothing may change the verdict
            gangs, per_node = _bound_by_gang(core, ns)
            partial = {g: n for g, n in gangs.items() if n not in (0, GANG_SIZE)}
            assert not partial, f"repetition {rep}: partial gangs {partial}"
            assert max(per_node.values()) <= GPUS, f"repetition {rep}: over-committed {per_node}"
        finally:
            proc.stop()
        core.delete_namespace(ns)
    # the crashes must really have interrupted gangs half way, or this test proves nothing
    assert partial_at_kill > 0, "no kill landed in the middle of a gang's binds"
