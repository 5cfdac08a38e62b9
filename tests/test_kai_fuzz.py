"""The differential fuzzer against KAI's own code (kai_ray/testing/kai_fuzz.py).

The unit tests check the fuzzer's own parts (the random clusters are consistent, a round is
applied as a cluster would move on, GPU group names are compared by structure). The slice runs
KAI v0.12.0's actions (the Go harness in benchmarks/kai_go, built with `go test -c`) and
kai_ray's core on the first seeds, round by round: every seed that diverges must be listed in
tests/kai_fuzz_known.yaml with its cause, and every listed seed must still diverge
(the list is what is left to fix or to document, not a place to hide a failure).
"""

from __future__ import annotations

import pathlib
import shutil
from collections import Counter

import pytest
import yaml

from kai_ray.core.model import PodStatus
from kai_ray.core.result import Bind, CycleResult, Evict
from kai_ray.testing import kai_fuzz
from kai_ray.testing.kai_harness import snapshot_json

KNOWN = pathlib.Path(__file__).parent / "kai_fuzz_known.yaml"
SLICE = range(0, 300)


@pytest.mark.parametrize("seed", range(40))
def test_random_clusters_fit_their_nodes(seed: int) -> None:
    snap = kai_fuzz.random_snapshot(seed)
    snapshot_json(snap)  # what the harness cannot express would raise
    nodes = {n.name: n for n in snap.nodes}
    cpu: Counter[str] = Counter()
    pods: Counter[str] = Counter()
    whole: Counter[str] = Counter()
    shared: dict[tuple[str, str], int] = {}
    for job in snap.jobs:
        placed = [p for p in job.pods if p.node]
        assert not placed or len(placed) >= job.min_member, job.name
        for pod in placed:
            cpu[pod.node] += pod.request.cpu_m
            pods[pod.node] += 1
            whole[pod.node] += pod.request.gpus
            for g in pod.gpu_groups:
                shared[pod.node, g] = shared.get((pod.node, g), 0) + pod.request.gpu_fraction_milli
    for name, node in nodes.items():
        devices = whole[name] + sum(1 for (n, _) in shared if n == name)
        assert cpu[name] <= node.cpu_m and pods[name] <= node.max_pods and devices <= node.gpus
    assert all(used <= 1000 for used in shared.values())


def test_a_round_moves_the_cluster_on() -> None:
    snap = kai_fuzz.random_snapshot(3)
    pods = {p.name: p for j in snap.jobs for p in j.pods}
    pending = next(n for n, p in pods.items() if p.status == PodStatus.PENDING)
    releasing = next(n for n, p in pods.items() if p.status == PodStatus.RELEASING)
    decided = kai_fuzz.Decisions(binds={pending: ("n1", ())}, pipelined={},
                                 evictions=frozenset(), raw_groups={pending: ()})
    after = {p.name: p for j in kai_fuzz.next_snapshot(snap, decided).jobs for p in j.pods}
    assert (after[pending].status, after[pending].node) == (PodStatus.RUNNING, "n1")
    # a releasing pod is gone a round later, made again pending by its controller
    assert (after[releasing].status, after[releasing].node) == (PodStatus.PENDING, None)
    running = kai_fuzz.Decisions(binds={}, pipelined={}, evictions=frozenset({pending}))
    again = kai_fuzz.next_snapshot(kai_fuzz.next_snapshot(snap, decided), running)
    moved = {p.name: p for j in again.jobs for p in j.pods}[pending]
    assert (moved.status, moved.node) == (PodStatus.RELEASING, "n1")


def test_gpu_groups_compare_by_structure() -> None:
    """KAI names a new shared device with a random id: two pods on one new device match ours
    whatever the names; on two new devices they do not; a device the snapshot has keeps its
    name."""
    snap = kai_fuzz.random_snapshot(0)
    frac = [p.name for j in snap.jobs for p in j.pods
            if p.request.gpu_fraction_milli and p.status == PodStatus.PENDING][:2]
    assert len(frac) == 2
    kai = kai_fuzz.kai_decisions(snap, {"binds": [[frac[0], "n0", "uuid-a"],
                                                  [frac[1], "n0", "uuid-a"]]})
    ours = kai_fuzz.our_decisions(snap, CycleResult(binds=[
        Bind("j", "default", frac[0], "n0", ("n0-gpu-1",)),
        Bind("j", "default", frac[1], "n0", ("n0-gpu-1",))]))
    assert kai == ours
    split = kai_fuzz.our_decisions(snap, CycleResult(binds=[
        Bind("j", "default", frac[0], "n0", ("n0-gpu-1",)),
        Bind("j", "default", frac[1], "n0", ("n0-gpu-2",))]))
    assert split != kai and split.diff(kai)


def test_kai_taking_back_a_pipelined_pod_is_not_a_pipeline() -> None:
    """A pod KAI pipelines and evicts again in one cycle stays pending: not pipelined, and
    not an eviction of a running pod."""
    snap = kai_fuzz.random_snapshot(0)
    pod = next(p.name for j in snap.jobs for p in j.pods if p.status == PodStatus.PENDING)
    kai = kai_fuzz.kai_decisions(snap, {"events": [["pipeline", pod, "n0"], ["evict", pod, "n0"]]})
    assert kai.pipelined == {} and kai.evictions == frozenset() and kai.taken_back == {pod}
    # pipelined again after that: pipelined, where the last call put it
    again = kai_fuzz.kai_decisions(snap, {"events": [["pipeline", pod, "n0"], ["evict", pod, "n0"],
                                                     ["pipeline", pod, "n1"]]})
    assert again.pipelined == {pod: "n1"} and not again.taken_back
    ours = kai_fuzz.our_decisions(snap, CycleResult(evictions=[
        Evict("j", "default", pod, None, "reclaim", "")]))
    assert ours.evictions == {pod}


@pytest.fixture(scope="module")
def harness() -> pathlib.Path:
    if shutil.which("go") is None:
        pytest.fail("the KAI fuzzer slice needs Go (>= 1.24) and the Go module proxy")
    from kai_ray.testing.kai_harness import build_harness
    return build_harness()


def test_the_fuzzer_slice_diverges_only_where_listed(harness: pathlib.Path) -> None:
    known = {int(k): v for k, v in (yaml.safe_load(KNOWN.read_text())["seeds"] or {}).items()}
    # three KAI runs a round, and twelve more where kai-ray equals none of them: a seed where
    # KAI varies and kai-ray equals one of its answers must not fail for a draw of Go's map order
    outcomes = kai_fuzz.fuzz(list(SLICE), rounds=4, runs=3, binary=harness, progress=False)
    assert not [o for o in outcomes if o.error]
    diverged = {o.seed: o.divergence for o in outcomes if o.divergence}
    new = {s: d for s, d in diverged.items() if s not in known}
    assert not new, f"divergences from KAI not in {KNOWN.name}: {new}"
    fixed = sorted(s for s in known if s in SLICE and s not in diverged)
    assert not fixed, f"seeds listed in {KNOWN.name} that no longer diverge: {fixed}"
    # the slice exercises all three kinds of decision
    assert sum(o.decided for o in outcomes) > 1000
