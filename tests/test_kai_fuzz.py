"""The differential fuzzer against KAI's own code (kai_ray/testing/kai_fuzz.py).

The unit tests check the fuzzer's own parts (the random clusters are consistent, a round is
applied as a cluster would move on, GPU group names are compared by structure). The slice runs
KAI v0.12.0's actions (the Go harness in benchmarks/kai_go, built with `go test -c`) and
kai_ray's core on the first seeds, round by round: every seed that diverges by more than a
documented deviation must be listed in tests/kai_fuzz_known.yaml with its cause, and every listed
seed must still diverge (the list is what is left to fix or to document, not a place to hide a
failure). A round that differs only by a deviation is proven so by KAI patched on that one point
(kai_ray.testing.kai_variants); the variants are checked to apply, and to explain their
deviation's own case.
"""

from __future__ import annotations

import pathlib
import shutil
from collections import Counter
from dataclasses import replace

import pytest
import yaml

from kai_ray.core.model import PodStatus, SchedulerConfig, Snapshot
from kai_ray.core.result import Bind, CycleResult, Evict
from kai_ray.core.schedule import schedule
from kai_ray.sim import scenario
from kai_ray.testing import kai_fuzz, kai_variants, snapshot_case
from kai_ray.testing.kai_harness import snapshot_json

KNOWN = pathlib.Path(__file__).parent / "kai_fuzz_known.yaml"
SCENARIOS = pathlib.Path(__file__).parent / "scenarios" / "kai-ray-extra.yaml"
FOUND = pathlib.Path(__file__).parent / "scenarios" / "kai-fuzz-found.yaml"
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


def test_a_variant_edit_must_find_its_anchor_once(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.go").write_text("x := 1\nx := 1\ny := 2\n")
    def variant(old: str) -> kai_variants.Variant:
        return kai_variants.Variant("v", "DEV-00", "test", (kai_variants.Edit("a.go", old, "z"),))
    with pytest.raises(kai_variants.VariantError, match="occurs 2 times"):
        kai_variants.apply_edits(tmp_path, [variant("x := 1")])
    with pytest.raises(kai_variants.VariantError, match="occurs 0 times"):
        kai_variants.apply_edits(tmp_path, [variant("w := 3")])
    kai_variants.apply_edits(tmp_path, [variant("y := 2")])
    assert (tmp_path / "a.go").read_text() == "x := 1\nx := 1\nz\n"


def test_attribution_tries_each_variant_then_all() -> None:
    sets = kai_fuzz.variant_sets()
    assert sets[:len(kai_variants.VARIANTS)] == [(n,) for n in kai_variants.VARIANTS]
    assert sets[-1] == tuple(kai_variants.VARIANTS)
    assert {v.deviation for v in kai_variants.VARIANTS.values()} >= {"DEV-02", "DEV-03"}
    out = kai_fuzz.Outcome(1, attributed=[(0, ("dev03-exact-fractions",)), (2, tuple(
        kai_variants.VARIANTS))])
    counts = kai_fuzz.attribution_counts([out, kai_fuzz.Outcome(2, attributed=[
        (1, ("dev03-exact-fractions",))])])
    assert counts["DEV-03"] == (2, 2)


@pytest.fixture(scope="module")
def harness() -> pathlib.Path:
    if shutil.which("go") is None:
        pytest.fail("the KAI fuzzer slice needs Go (>= 1.24) and the Go module proxy")
    from kai_ray.testing.kai_harness import build_harness
    return build_harness()


@pytest.fixture(scope="module")
def variants(harness: pathlib.Path) -> kai_fuzz.VariantBinaries:
    """The variant harnesses, built once for the module when a test first needs one."""
    return kai_fuzz.VariantBinaries()


@pytest.mark.parametrize("names", [(n,) for n in kai_variants.VARIANTS]
                         + [tuple(kai_variants.VARIANTS)])
def test_every_variant_applies_to_kais_source(harness: pathlib.Path,
                                              names: tuple[str, ...]) -> None:
    """Each anchor occurs once in KAI's module as the harness builds it (patched_kai raises
    otherwise), and the patched tree carries every edit."""
    tree = kai_variants.patched_kai(names)
    for name in names:
        for edit in kai_variants.VARIANTS[name].edits:
            assert (tree / edit.path).read_text().count(edit.new) == 1, (name, edit.path)


def _answers(binary: pathlib.Path, snap: Snapshot, tmp: pathlib.Path,
             runs: int = 3) -> list[kai_fuzz.Decisions]:
    answer = kai_fuzz.run_kai(binary, {"x": snap}, runs, 1, tmp)["x"]
    assert not answer.get("error"), answer["error"]
    return [kai_fuzz.kai_decisions(snap, run) for run in answer["runs"]]


def _proven_by(variant: str, snap: Snapshot, ours: kai_fuzz.Decisions,
               variants: kai_fuzz.VariantBinaries, tmp: pathlib.Path, runs: int = 3) -> None:
    """KAI patched by `variant` alone decides as kai-ray does on `snap` (in one of `runs` runs),
    and the fuzzer's attribution names that variant first (asked as many times again, at least
    the fuzzer's 3 + 12: a variant whose answer is one of several drawn by Go's map order must
    not miss it by chance)."""
    assert ours in _answers(variants((variant,)), snap, tmp, runs=runs)
    found = kai_fuzz.attribute({0: snap}, {0: ours}, 3, max(12, runs), 1, tmp, variants)
    assert found == {0: (variant,)}


def _case(case_id: str) -> Snapshot:
    return scenario.snapshot_of(next(c for c in scenario.load(SCENARIOS) if c.id == case_id))


def _ours(snap: Snapshot) -> kai_fuzz.Decisions:
    return kai_fuzz.our_decisions(snap, schedule(snap, SchedulerConfig(), now=0.0))


@pytest.mark.parametrize("case", scenario.load(FOUND), ids=lambda c: c.id)
def test_what_the_fuzzer_found_is_what_kai_decides(harness: pathlib.Path,
                                                   case: scenario.Scenario,
                                                   tmp_path: pathlib.Path) -> None:
    """Each case of kai-fuzz-found.yaml (each a behaviour of KAI's the fuzzer found and
    kai-ray now matches): kai-ray's whole cycle decides as one of KAI's runs of its own."""
    snap = scenario.snapshot_of(case)
    assert _ours(snap) in _answers(harness, snap, tmp_path, runs=15)


def test_dev03_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-03's case (eight 0.125 pods, a queue limit of 1 GPU): stock KAI binds none of them,
    kai-ray all eight; KAI counting fractions exactly binds them as kai-ray does."""
    snap = _case("DEV-03")
    ours = _ours(snap)
    assert len(ours.binds) == 8
    assert all(not d.binds for d in _answers(harness, snap, tmp_path))
    assert ours in _answers(variants(("dev03-exact-fractions",)), snap, tmp_path)
    # the other variant alone does not explain it: attribution names the right deviation
    assert ours not in _answers(variants(("dev02-no-bound-victims",)), snap, tmp_path)
    found = kai_fuzz.attribute({0: snap}, {0: ours}, 3, 12, 1, tmp_path, variants)
    assert found == {0: ("dev03-exact-fractions",)}


def test_dev02_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-02b's case: stock KAI binds pod-a-0 and evicts it in the same cycle (with keep-0, for
    a gang it pipelines); kai-ray binds it and evicts nothing; so does KAI whose victims leave
    out the pods bound in the cycle."""
    snap = _case("DEV-02b")
    ours = _ours(snap)
    assert ours.binds == {"pod-a-0": ("node0", ())} and not ours.evictions and not ours.pipelined
    stock = _answers(harness, snap, tmp_path)
    assert all(d.bound_taken_back == {"pod-a-0"} and d.evictions == {"keep-0"} for d in stock)
    assert ours not in stock
    _proven_by("dev02-no-bound-victims", snap, ours, variants, tmp_path)


def test_dev04_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-04's case: a reclaim step that moved frac-0 within node1 is undone; stock KAI then
    counts it twice on node1 and pipelines it on node0; kai-ray puts it on node1 again, and so
    does KAI whose undo of the move leaves nothing behind."""
    snap = _case("DEV-04")
    ours = _ours(snap)
    assert ours.pipelined.get("frac-0") == "node1"
    assert all(d.pipelined.get("frac-0") == "node0" for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-bug-discarded-move", snap, ours, variants, tmp_path)


def test_dev05_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-05's case: stock KAI evicts the recorded victim elastic-3 twice and so takes only two
    of elastic's pods, leaving queue-a over its limit; kai-ray takes three, and so does KAI
    that evicts a pod once."""
    snap = _case("DEV-05")
    ours = _ours(snap)
    assert ours.evictions == {"elastic-1", "elastic-2", "elastic-3"}
    assert all(d.evictions == {"elastic-2", "elastic-3"} and len(d.pipelined) == 3
               for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-bug-double-eviction", snap, ours, variants, tmp_path)


def test_dev06_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-06's case: stock KAI compares dept-b by the queue its stale heap holds on top and
    binds four; kai-ray binds two, and so does KAI whose heaps are ordered before each pop."""
    snap = _case("DEV-06")
    ours = _ours(snap)
    assert set(ours.binds) == {"small-0", "two-0", "two-1"}
    assert all(set(d.binds) == {"small-0", "four-0", "four-1", "four-2", "four-3"}
               for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-stale-queue-order", snap, ours, variants, tmp_path)


def test_dev07_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-07's case: stock KAI binds frac-0 onto the device gang-1 was allocated and then
    pipelined to (its stale allocated-memory entry reads as idle); kai-ray pipelines it there,
    and so does KAI that drops the entry."""
    snap = _case("DEV-07")
    ours = _ours(snap)
    assert ours.pipelined.get("frac-0") == "node0" and not ours.binds
    assert all(d.binds.get("frac-0", ("",))[0] == "node0"
               for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-stale-shared-gpu-entry", snap, ours, variants, tmp_path)


def test_dev08_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-08's case: gang is pipelined whole on node0; stock KAI gives back one of the three idle
    GPUs its allocated pods had taken and refuses cpu (no GPU) on a node at -2 free GPUs; kai-ray
    binds cpu, and so does KAI that leaves devices only pipelined pods hold out of the check."""
    snap = _case("DEV-08")
    ours = _ours(snap)
    assert ours.binds == {"cpu-0": ("node0", ())} and len(ours.pipelined) == 4
    assert all(not d.binds and set(d.pipelined) == set(ours.pipelined)
               for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-bug-pipelined-device-count", snap, ours, variants, tmp_path)


def test_dev09_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-09's case (seed 1765's snapshot): stock KAI unevicts j6-0 and j6-1 onto n2, where
    they were moved, and keeps them there; kai-ray moves j6 to n0, and so does KAI that pipelines
    a pod placed back on the node it was moved from (its answer varies with Go's map order: one
    of its runs)."""
    snap = _case("DEV-09")
    ours = _ours(snap)
    assert {ours.pipelined.get(f"j6-{i}") for i in range(3)} == {"n0"}
    assert all(d.pipelined.get("j6-0") == "n2" and "j6-2" not in d.evictions
               for d in _answers(harness, snap, tmp_path))
    # the variant answers so about 1 run in 5 (21 of 100 runs on 11-29): 60 runs miss it with
    # odds below 1e-6, where the 15 asked before missed it once in CI (0.79**15 = 3 %)
    _proven_by("kai-bug-unevict-other-node", snap, ours, variants, tmp_path, runs=60)


def test_dev12_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-12's case: stock KAI takes an idle GPU of node0 away when reclaim evicts sharer (w's
    pipelined GPU counted as taken from idle) and leaves p pending; kai-ray reclaims for p, and
    so does KAI whose guard leaves out pipelined pods' GPUs."""
    snap = _case("DEV-12")
    ours = _ours(snap)
    assert ours.pipelined == {"w-0": "node0", "p-0": "node0"}
    assert ours.evictions == {"sharer-0"}
    assert all("p-0" not in d.pipelined and not d.evictions
               for d in _answers(harness, snap, tmp_path))
    _proven_by("kai-bug-pipelined-gpus-as-idle-taken", snap, ours, variants, tmp_path)


def test_dev14_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-14's case: stock KAI's preempt action panics when elastic, whose pods it took for
    big, comes up as a preemptor with no pod left to allocate; kai-ray decides nothing more
    for elastic, and so does KAI with upstream's nil-scenario guard."""
    snap = _case("DEV-14")
    ours = _ours(snap)
    assert ours.evictions == {"elastic-0", "elastic-1"} and set(ours.pipelined) == {"big-0"}
    stock = kai_fuzz.run_kai(harness, {"x": snap}, 3, 1, tmp_path)["x"]
    assert "panicked" in stock.get("error", ""), stock
    _proven_by("kai-bug-nil-scenario", snap, ours, variants, tmp_path)




def test_dev10_case_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-10's case: consolidation pipelines j7's two pods onto the GPU j5-0 releases on n1;
    j8's scenario places them again beside j8-0. Stock KAI keeps the releasing GPU j7 took the
    first time and finds none for j8 (in every one of 12 runs); kai-ray pipelines all three on
    that GPU, and so does KAI that gives the releasing GPU back (and no variant before it)."""
    snap = _case("DEV-10")
    ours = _ours(snap)
    assert ours.pipelined == {"j5-0": "n2", "j7-0": "n1", "j7-1": "n1", "j8-0": "n1"}
    assert ours.evictions == {"j5-0"}
    assert all("j8-0" not in d.pipelined
               for d in _answers(harness, snap, tmp_path, runs=12))
    _proven_by("kai-bug-kept-reservation", snap, ours, variants, tmp_path)


def test_dev10_seed_is_proven_by_its_variant(harness: pathlib.Path,
                                             variants: kai_fuzz.VariantBinaries,
                                             tmp_path: pathlib.Path) -> None:
    """DEV-10 on seed 585, round 3: a discarded reclaim scenario evicts
    the three pipelined sharers of n0's device; undone, stock KAI keeps n0 a GPU short and
    refuses the CPU-only j0 there, so it reclaims nothing for j10. kai-ray moves j0 to n0, and
    so does KAI that gives the releasing GPU back (with DEV-04's undo fixed as well: a later
    scenario of the round moves a sharer within n0 and drops it)."""
    snap = snapshot_case.round_snapshot(585, 3)
    ours = _ours(snap)
    assert {"j0-0", "j0-1"} <= ours.evictions and ours.pipelined.get("j0-0") == "n0"
    assert all(not {"j0-0", "j0-1"} & d.evictions for d in _answers(harness, snap, tmp_path))
    assert ours in _answers(variants(("kai-bug-discarded-move", "kai-bug-kept-reservation")),
                            snap, tmp_path)


def test_dev10_second_seed_is_proven_by_its_variant(harness: pathlib.Path,
                                                    variants: kai_fuzz.VariantBinaries,
                                                    tmp_path: pathlib.Path) -> None:
    """DEV-10 on seed 1906, round 1: consolidation pipelined j7's three fractions onto the
    device j5-0 releases on n1; j8's scenarios evict them (each turns releasing there), and stock
    KAI keeps the releasing GPU the pipelining took while the device is still counted off idle,
    so n1 has no GPU left for j8. kai-ray pipelines j8 beside them, and so does KAI that gives
    the releasing GPU back, with no other deviation."""
    snap = snapshot_case.round_snapshot(1906, 1)
    ours = _ours(snap)
    assert ours.pipelined.get("j8-0") == ours.pipelined.get("j8-1") == "n1"
    assert all(not {"j8-0", "j8-1"} & set(d.pipelined) for d in _answers(harness, snap, tmp_path))
    assert ours in _answers(variants(("kai-bug-kept-reservation",)), snap, tmp_path)


def test_dev14_stale_cache_seed_is_proven_by_its_variant(harness: pathlib.Path,
                                                         variants: kai_fuzz.VariantBinaries,
                                                         tmp_path: pathlib.Path) -> None:
    """DEV-14's stale cache on seed 1141, round 1: reclaim for j4 commits evicting j0's running
    pods, and KAI keeps j0's cached pods to allocate (those two, listed while their eviction was
    virtual), so j0 asks for nothing: it heads d1 in j2's victim scenarios at no cost, d1 goes
    before d0 and j2 is placed before its victim j1. Stock KAI then panics on j0 as a
    preemptor; with the nil-scenario guard it pipelines j2 whole onto n3. kai-ray counts j0's
    two pending pods (d0 first: j1 placed again before j2), and so does KAI that drops a job's
    cache when an eviction is committed, with no other deviation."""
    snap = snapshot_case.round_snapshot(1141, 1)
    ours = _ours(snap)
    assert ours.pipelined.get("j2-1") == "n4" and ours.pipelined.get("j1-1") == "n3"
    assert all(d.pipelined.get("j2-1") == "n3"
               for d in _answers(variants(("kai-bug-nil-scenario",)), snap, tmp_path))
    _proven_by("kai-bug-stale-tasks-cache", snap, ours, variants, tmp_path)


def test_dev02_variant_keeps_running_and_pipelined_pods_victims(
        harness: pathlib.Path, variants: kai_fuzz.VariantBinaries,
        tmp_path: pathlib.Path) -> None:
    """Only pods bound in the cycle stop being victims: where KAI reclaims a running pod, or
    takes back a pod consolidation pipelined (DEV-02's own case), the variant does the same."""
    dev02 = variants(("dev02-no-bound-victims",))
    bound = _case("DEV-02b")
    running = replace(bound, jobs=tuple(j for j in bound.jobs if j.name != "pod-a"))
    for snap in (running, _case("DEV-02")):
        stock = _answers(harness, snap, tmp_path)
        assert stock[0].evictions or stock[0].taken_back
        assert set(map(kai_fuzz._key, _answers(dev02, snap, tmp_path))) == set(
            map(kai_fuzz._key, stock))


def test_the_fuzzer_slice_diverges_only_where_listed(harness: pathlib.Path,
                                                     variants: kai_fuzz.VariantBinaries) -> None:
    known = {int(k): v for k, v in (yaml.safe_load(KNOWN.read_text())["seeds"] or {}).items()}
    # three KAI runs a round, and twelve more where kai-ray equals none of them: a seed where
    # KAI varies and kai-ray equals one of its answers must not fail for a draw of Go's map order;
    # a round still unmatched is run on KAI's variants, and differs only if none matches
    outcomes = kai_fuzz.fuzz(list(SLICE), rounds=4, runs=3, binary=harness, progress=False,
                             variants=variants)
    assert not [o for o in outcomes if o.error]
    diverged = {o.seed: o.divergence for o in outcomes if o.divergence}
    new = {s: d for s, d in diverged.items() if s not in known}
    assert not new, f"divergences from KAI not in {KNOWN.name}: {new}"
    fixed = sorted(s for s in known if s in SLICE and s not in diverged)
    assert not fixed, f"seeds listed in {KNOWN.name} that no longer diverge: {fixed}"
    # the slice exercises all three kinds of decision, and both deviations
    assert sum(o.decided for o in outcomes) > 1000
    assert {"DEV-02", "DEV-03"} <= set(kai_fuzz.attribution_counts(outcomes))


@pytest.mark.parametrize("seed", [3, 585, 1141, 1906])
def test_a_fuzzer_snapshot_written_as_a_case_reads_back_the_same(seed: int,
                                                                tmp_path: pathlib.Path) -> None:
    """snapshot_case writes a round's snapshot as a scenario case that loads back equal, with
    the fuzzer's configuration, over the rounds kai-ray's own decisions make (pipelined and
    releasing pods, shared devices)."""
    for r in range(4):
        snap = snapshot_case.round_snapshot(seed, r)
        path = tmp_path / f"round-{r}.yaml"
        path.write_text("scenarios:\n" + snapshot_case.dump(snapshot_case.case_of(snap, "x")))
        case = scenario.load(path)[0]
        assert scenario.snapshot_of(case) == snap
        assert scenario.config_of(case) == SchedulerConfig()
