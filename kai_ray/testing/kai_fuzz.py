"""Differential fuzzer: kai_ray's core against KAI-Scheduler's own code, round by round.

    python3 -m kai_ray.testing.kai_fuzz --seeds 2000 [--first 0] [--rounds 4] [--runs 3]
                                        [--procs 8] [--core auto|python|native] [--keep DIR]
    python3 -m kai_ray.testing.kai_fuzz --only SEED,SEED,... [--rounds 4]
    python3 -m kai_ray.testing.kai_fuzz --show SEED [--rounds 4]

Each seed is a random small cluster (2-8 nodes of 0-8 GPUs; one or two top-level queues with
one to three leaf queues each, with GPU quota, limit and over-quota weight; jobs of whole-GPU,
fractional or CPU-only pods, gangs and elastic jobs, priorities that are preemptible (< 100) or
not; some jobs already running, some of them releasing). Each round runs KAI v0.12.0's full
cycle (allocate, consolidation, reclaim, preempt, stale-gang eviction; the Go harness in
benchmarks/kai_go, built with KAI's test utilities) and kai_ray's `schedule()` on the same
snapshot, and compares what each decided:

- binds: pod -> node and GPU group (a group the snapshot already has keeps its name; a group
  made this cycle is named by the order its first pod comes in, as KAI's ids are random);
- pipelined pods: pod -> node (KAI's pods that the same cycle pipelines and then evicts again
  count as not pipelined: they stay pending);
- evictions of pods that were running.

KAI's choices can differ between runs of one snapshot (Go map order), so KAI runs `--runs` times
(12 more where ours equals none of those) and ours must equal one of them. A round that matches
is applied to make the next round's snapshot: bound pods run, evicted pods release (and are
recreated pending a round later), pipelined pods stay pending, some jobs finish and new ones
arrive. A round ours matches none of KAI's answers is run on KAI patched to decide as kai-ray
does on one documented deviation (kai_ray.testing.kai_variants: each variant alone, then all
together): if ours matches one, the round is attributed to that deviation and the seed goes on
from kai-ray's decisions. Otherwise the seed stops at that divergence, which is printed (with the
snapshot's file when `--keep` is given); a round on which KAI's code panics goes to the variants
too, and the seed stops there, counted apart, when none decides it. The exit status is nonzero
only for divergences no variant explains.

What KAI's test utilities cannot express is not generated (kai_ray.testing.kai_harness says what):
sub-groups, gpu-memory requests, CPU and memory quotas, placement constraints, stale gangs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
from kai_ray.core.result import CycleResult
from kai_ray.sim.synthetic import OPEN  # unlimited, weight 1
from kai_ray.testing.kai_harness import build_harness, harness_dir, kai_version, snapshot_json
from kai_ray.testing.kai_variants import VARIANTS, build_variant

GIB = 1 << 30


# --- random clusters ---------------------------------------------------------------------------

@dataclass
class _Room:
    """What a node has left while the generator places running pods."""

    cpu_m: int
    memory: int
    pods: int
    whole: int  # free GPUs
    shared: dict[str, int] = field(default_factory=dict)  # group -> milli-GPU used
    made: int = 0

    def place(self, node: str, req: Request) -> tuple[str, ...] | None:
        """The pod's GPU groups if it fits (and the room taken), else None."""
        if req.cpu_m > self.cpu_m or req.memory > self.memory or self.pods < 1:
            return None
        groups: tuple[str, ...] = ()
        if req.gpu_fraction_milli:
            group = next((g for g, used in self.shared.items()
                          if used + req.gpu_fraction_milli <= 1000), None)
            if group is None:
                if self.whole < 1:
                    return None
                self.whole -= 1
                group = f"{node}-g{self.made}"
                self.made += 1
                self.shared[group] = 0
            self.shared[group] += req.gpu_fraction_milli
            groups = (group,)
        elif req.gpus:
            if req.gpus > self.whole:
                return None
            self.whole -= req.gpus
        self.cpu_m -= req.cpu_m
        self.memory -= req.memory
        self.pods -= 1
        return groups


def random_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(2, 8)):
        gpus = rng.choice((2, 4, 8)) if i == 0 else rng.choice((0, 2, 4, 4, 8))
        nodes.append(Node(f"n{i}", cpu_m=rng.choice((16_000, 32_000, 64_000)),
                          memory=rng.choice((64, 128, 256)) * GIB, gpus=gpus,
                          gpu_memory_mib=81920, max_pods=rng.choice((4, 8, 110))))
    total = sum(n.gpus for n in nodes)
    queues: list[Queue] = []
    leaves: list[str] = []
    for d in range(rng.randint(1, 2)):
        quota = float(rng.randint(0, total))
        limit = rng.choice((-1.0, -1.0, quota + rng.randint(1, 4)))
        # KAI's test departments weigh their over-quota share by their quota
        queues.append(Queue(f"d{d}", gpu=ResourceQuota(quota, limit, quota), cpu=OPEN,
                            memory=OPEN, created=float(d)))
    for q in range(rng.randint(len(queues), 3 * len(queues))):
        parent = queues[q % len([x for x in queues if x.parent is None])].name
        quota = float(rng.choice((0, 0, 1, 2, 4, total // 2)))
        limit = rng.choice((-1.0, -1.0, quota + rng.randint(1, 4)))
        weight = float(rng.choice((0, 1, 1, 2, 3)))
        leaves.append(f"q{q}")
        queues.append(Queue(f"q{q}", parent=parent, gpu=ResourceQuota(quota, limit, weight),
                            cpu=OPEN, memory=OPEN, created=float(q)))
    rooms = {n.name: _Room(n.cpu_m, n.memory, n.max_pods, n.gpus) for n in nodes}
    jobs = [_random_job(rng, j, leaves, rooms) for j in range(rng.randint(2, 10))]
    return Snapshot(nodes=tuple(nodes), queues=tuple(queues), jobs=tuple(jobs))


def _random_job(rng: random.Random, j: int, leaves: Sequence[str],
                rooms: dict[str, _Room] | None) -> Job:
    """Job `j<j>`; with `rooms`, half the time it already runs where `rooms` has room."""
    size = rng.choice((1, 1, 1, 2, 2, 3, 4))
    cpu = rng.choice((500, 1000, 4000, 8000))
    memory = rng.choice((1, 4, 16)) * GIB
    kind = rng.random()
    if kind < 0.15:
        req = Request(cpu_m=cpu, memory=memory)
    elif kind < 0.45:
        req = Request(cpu_m=cpu, memory=memory,
                      gpu_fraction_milli=rng.choice((125, 250, 500, 750)))
    else:
        req = Request(cpu_m=cpu, memory=memory, gpus=rng.choice((1, 1, 1, 2, 4)))
    min_member = size if rng.random() < 0.75 else rng.randint(1, size)
    name = f"j{j}"
    placed: list[tuple[str, tuple[str, ...]]] = []
    if rooms is not None and rng.random() < 0.5:  # running: all, or an elastic job's minimum+
        want = size if min_member == size else rng.randint(min_member, size)
        order = list(rooms)
        for _ in range(want):
            rng.shuffle(order)
            spot = next(((n, g) for n in order
                         if (g := rooms[n].place(n, req)) is not None), None)
            if spot is None:
                break
            placed.append(spot)
        if len(placed) < min_member:
            placed = []  # (the room stays taken in `rooms`: later jobs see less than is free)
    releasing = bool(placed) and rng.random() < 0.15
    pods = []
    for i in range(size):
        if i < len(placed):
            node, groups = placed[i]
            status = PodStatus.RELEASING if releasing else PodStatus.RUNNING
            pods.append(Pod(f"{name}-{i}", req, status=status, node=node, gpu_groups=groups,
                            created=float(j)))
        else:
            pods.append(Pod(f"{name}-{i}", req, created=float(j)))
    return Job(name=name, queue=rng.choice(leaves), priority=rng.choice((50, 50, 100, 125)),
               pods=tuple(pods), min_member=min_member, created=float(j))


def arrivals(snap: Snapshot, seed: int, round_: int) -> Snapshot:
    """Between rounds: some jobs whose pods all run finish and leave, and up to two new jobs
    arrive, pending (drawn from the seed and the round, so that a run can be repeated)."""
    rng = random.Random(seed * 1000 + round_)
    kept = [j for j in snap.jobs
            if not (all(p.status == PodStatus.RUNNING for p in j.pods) and rng.random() < 0.15)]
    leaves = [q.name for q in snap.queues if q.parent is not None]
    first = 1 + max((int(j.name[1:]) for j in snap.jobs), default=-1)
    kept += [_random_job(rng, first + k, leaves, None) for k in range(rng.randint(0, 2))]
    return replace(snap, jobs=tuple(kept))


# --- decisions, compared -----------------------------------------------------------------------

@dataclass(frozen=True)
class Decisions:
    binds: dict[str, tuple[str, tuple[str, ...]]]  # pod -> node, GPU groups (normalised)
    pipelined: dict[str, str]  # pod -> node
    evictions: frozenset[str]  # pods that were running
    raw_groups: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    taken_back: frozenset[str] = field(default=frozenset(), compare=False)
    # bound and evicted in one cycle (kai-ray takes no pod bound in the cycle: DEV-02)
    bound_taken_back: frozenset[str] = field(default=frozenset(), compare=False)

    def diff(self, other: Decisions) -> list[str]:
        """What differs, as lines: `self` is KAI, `other` kai_ray."""
        lines = []
        for what, mine, theirs in (("bind", self.binds, other.binds),
                                   ("pipeline", self.pipelined, other.pipelined)):
            for pod in sorted(set(mine) | set(theirs)):
                if mine.get(pod) != theirs.get(pod):
                    lines.append(f"{what} {pod}: KAI {mine.get(pod, '-')}, "
                                 f"kai-ray {theirs.get(pod, '-')}")
        for pod in sorted(self.evictions ^ other.evictions):
            lines.append(f"evict {pod}: KAI {'yes' if pod in self.evictions else 'no'}, "
                         f"kai-ray {'yes' if pod in other.evictions else 'no'}")
        return lines


def _pods(snap: Snapshot) -> dict[str, Pod]:
    return {p.name: p for j in snap.jobs for p in j.pods}


def _normalise(snap: Snapshot, binds: Iterable[tuple[str, str, Sequence[str]]]
               ) -> dict[str, tuple[str, tuple[str, ...]]]:
    pods = _pods(snap)
    known = {g for p in pods.values() if p.node for g in p.gpu_groups}
    fresh: dict[str, str] = {}
    out = {}
    for pod, node, groups in sorted(binds):
        if not pods[pod].request.gpu_fraction_milli:
            groups = ()  # a whole-GPU pod's devices are not a shared group
        names = tuple(g if g in known else fresh.setdefault(g, f"new#{len(fresh)}")
                      for g in groups)
        out[pod] = (node, names)
    return out


def kai_decisions(snap: Snapshot, run: dict[str, Any]) -> Decisions:
    """KAI's calls to its cache, by the last one each pod got: a pod whose last call pipelines
    it is pipelined (a consolidation move evicts and then pipelines a running pod; a pending pod
    pipelined and then evicted again stays pending, and is `taken_back`)."""
    pods = _pods(snap)
    running = {PodStatus.RUNNING, PodStatus.RELEASING}
    last: dict[str, list[str]] = {}
    for event in run.get("events") or ():
        last[event[1]] = event
    evicted = {e[1] for e in run.get("events") or () if e[0] == "evict"}
    bound = {e[1] for e in run.get("events") or () if e[0] == "bind"}
    binds = [(b[0], b[1], b[2:]) for b in run.get("binds") or ()]
    return Decisions(binds=_normalise(snap, binds),
                     pipelined={pod: e[2] for pod, e in last.items() if e[0] == "pipeline"},
                     evictions=frozenset(p for p in evicted if pods[p].status in running),
                     raw_groups={b[0]: tuple(b[2:]) for b in run.get("binds") or ()},
                     taken_back=frozenset(p for p in evicted if pods[p].status
                                          == PodStatus.PENDING and last[p][0] == "evict"),
                     bound_taken_back=frozenset(p for p in evicted if p in bound))


def our_decisions(snap: Snapshot, result: CycleResult) -> Decisions:
    binds = [(b.pod, b.node, b.gpu_groups) for b in result.binds]
    return Decisions(binds=_normalise(snap, binds),
                     pipelined={p.pod: p.node for p in result.pipelined},
                     evictions=frozenset(e.pod for e in result.evictions),
                     raw_groups={b.pod: b.gpu_groups for b in result.binds})


def next_snapshot(snap: Snapshot, decided: Decisions) -> Snapshot:
    """The cluster a round later: bound pods run; evicted pods release; pods that were releasing
    are gone, and their controllers have made them again, pending; pipelined pods stay pending
    (a later cycle decides them again)."""
    jobs = []
    for job in snap.jobs:
        pods = []
        for pod in job.pods:
            if pod.name in decided.binds:
                pod = replace(pod, status=PodStatus.RUNNING, node=decided.binds[pod.name][0],
                              gpu_groups=decided.raw_groups[pod.name])
            elif pod.name in decided.evictions:
                pod = replace(pod, status=PodStatus.RELEASING)
            elif pod.status == PodStatus.RELEASING:
                pod = replace(pod, status=PodStatus.PENDING, node=None, gpu_groups=())
            pods.append(pod)
        jobs.append(replace(job, pods=tuple(pods)))
    return replace(snap, jobs=tuple(jobs))


# --- running KAI and kai_ray -------------------------------------------------------------------

def run_kai(binary: pathlib.Path, cases: dict[str, Snapshot], runs: int, procs: int,
            workdir: pathlib.Path, log: tuple[int, pathlib.Path] | None = None
            ) -> dict[str, dict[str, Any]]:
    """KAI's answers by case id, from `procs` harness processes side by side (each cycle of
    the harness waits ~0.1 s for its cache mock's informers: waiting, not computing). `log`:
    KAI's own log at that verbosity is written to that file (one process)."""
    ids = sorted(cases)
    chunks = [ids[i::procs] for i in range(procs) if ids[i::procs]]

    def one(k: int, chunk: list[str]) -> list[dict[str, Any]]:
        src, dst = workdir / f"in-{k}.jsonl", workdir / f"out-{k}.jsonl"
        src.write_text("".join(json.dumps({"id": c, **snapshot_json(cases[c])}) + "\n"
                               for c in chunk))
        env = {**os.environ, "KAI_FUZZ_IN": str(src), "KAI_FUZZ_OUT": str(dst),
               "KAI_FUZZ_RUNS": str(runs)}
        if log is not None:
            env["KAI_FUZZ_LOG"] = str(log[0])
        done = subprocess.run([str(binary), "-test.run", "^TestKAIFuzz$", "-test.timeout", "0"],
                              cwd=harness_dir(), env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the KAI harness failed on {src}:\n{done.stdout[-3000:]}"
                               f"{done.stderr[-3000:]}")
        if log is not None:
            log[1].write_text(done.stdout + done.stderr)
        return [json.loads(line) for line in dst.read_text().splitlines()]

    answers: dict[str, dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(len(chunks) or 1) as pool:
        for part in pool.map(lambda kc: one(*kc), enumerate(chunks)):
            answers.update((a["id"], a) for a in part)
    return answers


@dataclass
class Outcome:
    seed: int
    rounds: int = 0  # rounds that matched
    divergence: list[str] = field(default_factory=list)
    diverged_round: int | None = None
    kai_varied: int = 0  # rounds where KAI's runs differed among themselves
    taken_back: int = 0  # pods KAI pipelined and evicted again in one cycle
    bound_taken_back: int = 0  # pods KAI bound and evicted again in one cycle
    decided: int = 0  # binds + pipelined + evictions agreed on
    kai_panic: str | None = None  # KAI's own code crashed on the snapshot: the seed stops
    error: str | None = None
    # rounds that equal only a KAI variant's answer (kai_variants): round, the variants' names
    attributed: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)


class VariantBinaries:
    """The harness built against each set of KAI variants, built the first time a round needs
    it (a build of a new set takes minutes; most runs need none or one)."""

    def __init__(self, built: dict[tuple[str, ...], pathlib.Path] | None = None) -> None:
        self.built = dict(built or {})

    def __call__(self, names: tuple[str, ...]) -> pathlib.Path:
        if names not in self.built:
            self.built[names] = build_variant(names)
        return self.built[names]


def variant_sets() -> list[tuple[str, ...]]:
    """What attribution tries, in order: each variant alone, then all of them together (a
    round may differ by two deviations at once)."""
    sets: list[tuple[str, ...]] = [(name,) for name in VARIANTS]
    return [*sets, tuple(VARIANTS)] if len(VARIANTS) > 1 else sets


def _matching(binary: pathlib.Path, snaps: dict[int, Snapshot], ours: dict[int, Decisions],
              runs: int, procs: int, workdir: pathlib.Path) -> set[int]:
    """The seeds whose `ours` equals one of `runs` answers of the harness `binary`."""
    answers = run_kai(binary, {str(s): snap for s, snap in snaps.items()}, runs, procs, workdir)
    return {s for s, snap in snaps.items()
            if ours[s] in [kai_decisions(snap, run) for run in answers[str(s)].get("runs") or ()]}


def attribute(snaps: dict[int, Snapshot], ours: dict[int, Decisions], runs: int,
              retry_runs: int, procs: int, workdir: pathlib.Path,
              binaries: VariantBinaries) -> dict[int, tuple[str, ...]]:
    """For snapshots where `ours` equals none of stock KAI's answers: the first variant set
    (variant_sets) one of whose answers it equals, asked `runs` times and `retry_runs` more
    where none matched, as stock KAI is. Sound because each variant is KAI's own code with
    only its deviation's rule changed: kai-ray equal to that answer differs from KAI by that
    rule and nothing else on this snapshot."""
    left = dict(snaps)
    found: dict[int, tuple[str, ...]] = {}
    for names in variant_sets():
        for n in (runs, retry_runs):
            if not left:
                return found
            for seed in _matching(binaries(names), left, ours, n, procs, workdir):
                found[seed] = names
                del left[seed]
    return found


def fuzz(seeds: Sequence[int], rounds: int = 4, runs: int = 3, procs: int = 8,
         core: str = "auto", keep: pathlib.Path | None = None,
         binary: pathlib.Path | None = None, progress: bool = True,
         retry_runs: int = 12, variants: VariantBinaries | None = None,
         attributing: bool = True) -> list[Outcome]:
    """Each seed round by round (see the module doc). A round where kai_ray's decisions equal
    none of KAI's `runs` answers is asked of KAI `retry_runs` more times: KAI's answer depends
    on Go's map order, and a miss must not be a draw of it. A round that still matches none is
    run on KAI's variants (`attribute`; `attributing=False` skips that): one that matches is
    attributed to its deviation and the seed goes on with kai-ray's decisions."""
    from kai_ray.core.schedule import schedule

    binary = binary or build_harness()
    variants = variants if variants is not None else VariantBinaries()
    outcomes = {s: Outcome(s) for s in seeds}
    live = {s: random_snapshot(s) for s in seeds}
    config = SchedulerConfig()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            if not live:
                break
            start = time.perf_counter()
            answers = run_kai(binary, {f"{s}/{r}": snap for s, snap in live.items()}, runs,
                              procs, pathlib.Path(tmp))
            following: dict[int, Snapshot] = {}
            unmatched: dict[int, tuple[Decisions, list[Decisions]]] = {}
            # rounds where KAI's code panicked: a variant may decide them (DEV-14 is KAI's own
            # fix of a crash), else the seed stops there
            panicked: dict[int, tuple[Decisions, str]] = {}
            for seed, snap in live.items():
                out = outcomes[seed]
                answer = answers[f"{seed}/{r}"]
                if answer.get("error", "").startswith("KAI panicked"):
                    if attributing:
                        ours = our_decisions(snap, schedule(snap, config, now=0.0, core=core))
                        panicked[seed] = (ours, answer["error"])
                    else:
                        out.kai_panic = f"round {r}: {answer['error']}"
                        _keep(keep, seed, r, snap)
                    continue
                if answer.get("error"):
                    out.error = f"round {r}: the harness refused the snapshot: {answer['error']}"
                    continue
                theirs = [kai_decisions(snap, run) for run in answer["runs"]]
                ours = our_decisions(snap, schedule(snap, config, now=0.0, core=core))
                out.kai_varied += len(set(map(_key, theirs))) > 1
                out.taken_back += len(theirs[0].taken_back)
                out.bound_taken_back += len(theirs[0].bound_taken_back)
                if ours in theirs:
                    _matched(out, snap, ours, following, r)
                else:
                    unmatched[seed] = (ours, theirs)
            if unmatched:  # KAI's answer may vary: ask it more times before calling it a miss
                again = run_kai(binary, {f"{s}/{r}": live[s] for s in unmatched}, retry_runs,
                                procs, pathlib.Path(tmp))
                for seed, (ours, _) in list(unmatched.items()):
                    out, snap = outcomes[seed], live[seed]
                    more = [kai_decisions(snap, run) for run in again[f"{seed}/{r}"].get("runs")
                            or ()]
                    if ours in more:
                        out.kai_varied += 1
                        _matched(out, snap, ours, following, r)
                        del unmatched[seed]
            if (unmatched or panicked) and attributing:
                found = attribute({s: live[s] for s in [*unmatched, *panicked]},
                                  {s: ours for s, (ours, _) in [*unmatched.items(),
                                                                *panicked.items()]},
                                  runs, retry_runs, procs, pathlib.Path(tmp), variants)
                for seed, names in found.items():
                    out = outcomes[seed]
                    out.attributed.append((r, names))
                    ours = (unmatched.pop(seed) if seed in unmatched else panicked.pop(seed))[0]
                    # kai-ray's decisions are the product: the seed goes on from them
                    following[seed] = arrivals(next_snapshot(live[seed], ours), seed, r)
            for seed, (_, error) in panicked.items():
                outcomes[seed].kai_panic = f"round {r}: {error}"
                _keep(keep, seed, r, live[seed])
            if unmatched:
                for seed, (ours, theirs) in unmatched.items():
                    out, snap = outcomes[seed], live[seed]
                    out.diverged_round = r
                    out.divergence = theirs[0].diff(ours) + [
                        f"(KAI bound {p} and evicted it in the same cycle)"
                        for p in sorted(theirs[0].bound_taken_back)]
                    _keep(keep, seed, r, snap)
            live = following
            if progress:
                attributed = sum(1 for o in outcomes.values() if o.attributed
                                 and o.attributed[-1][0] == r)
                print(f"round {r}: {len(answers)} snapshots in "
                      f"{time.perf_counter() - start:.0f} s, {attributed} attributed to a "
                      f"deviation, {len(live)} seeds go on", file=sys.stderr)
    return [outcomes[s] for s in seeds]


def _matched(out: Outcome, snap: Snapshot, ours: Decisions, following: dict[int, Snapshot],
             r: int) -> None:
    out.rounds += 1
    out.decided += len(ours.binds) + len(ours.pipelined) + len(ours.evictions)
    following[out.seed] = arrivals(next_snapshot(snap, ours), out.seed, r)


def _keep(keep: pathlib.Path | None, seed: int, r: int, snap: Snapshot) -> None:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        path = keep / f"seed-{seed}-round-{r}.json"
        path.write_text(json.dumps({"seed": seed, "round": r, **snapshot_json(snap)}, indent=1))


def _key(d: Decisions) -> tuple[Any, ...]:
    return (tuple(sorted(d.binds.items())), tuple(sorted(d.pipelined.items())),
            tuple(sorted(d.evictions)))


def show(seed: int, rounds: int, core: str, kai_log: int | None = None) -> None:
    """One seed's rounds in full: the snapshot, KAI's and kai_ray's decisions; `kai_log`: KAI's
    own log of each round at that verbosity goes to kai-seed-SEED-round-R.log."""
    from kai_ray.core.schedule import schedule

    binary = build_harness()
    variants = VariantBinaries()
    snap = random_snapshot(seed)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            print(f"## round {r}")
            for job in snap.jobs:
                pods = ", ".join(f"{p.name} {p.status}{'@' + p.node if p.node else ''}"
                                 f"{list(p.gpu_groups) if p.gpu_groups else ''}" for p in job.pods)
                req = job.pods[0].request
                print(f"  {job.name} queue {job.queue} prio {job.priority} min {job.min_member} "
                      f"gpus {req.gpus} frac {req.gpu_fraction_milli} cpu {req.cpu_m}: {pods}")
            log = None
            if kai_log is not None:
                log = (kai_log, pathlib.Path(f"kai-seed-{seed}-round-{r}.log"))
                print(f"  KAI's log: {log[1]}")
            answer = run_kai(binary, {"x": snap}, 1 if log else 3, 1, pathlib.Path(tmp), log)["x"]
            ours = our_decisions(snap, schedule(snap, SchedulerConfig(), now=0.0, core=core))
            if answer.get("error"):
                print(f"  KAI: {answer['error']}\n  kai-ray: {ours}")
                found = None
                if answer["error"].startswith("KAI panicked"):
                    found = attribute({0: snap}, {0: ours}, 3, 12, 1, pathlib.Path(tmp),
                                      variants).get(0)
                if found is None:
                    return
                print(f"  ATTRIBUTED: KAI with variants {', '.join(found)} decides as kai-ray "
                      "does; going on with kai-ray's decisions")
                snap = arrivals(next_snapshot(snap, ours), seed, r)
                continue
            theirs = [kai_decisions(snap, run) for run in answer["runs"]]
            print(f"  KAI: {theirs[0]}\n  kai-ray: {ours}")
            if ours not in theirs:
                more = run_kai(binary, {"x": snap}, 12, 1, pathlib.Path(tmp))["x"].get("runs")
                if ours in [kai_decisions(snap, run) for run in more or ()]:
                    print("  (equals one of 12 more KAI runs: KAI's answer varies)")
                else:
                    found = attribute({0: snap}, {0: ours}, 3, 12, 1, pathlib.Path(tmp),
                                      variants).get(0)
                    if found is None:
                        print("  DIVERGED (and no KAI variant decides as kai-ray does):\n    "
                              + "\n    ".join(theirs[0].diff(ours)))
                        return
                    print("  differs from KAI:\n    " + "\n    ".join(theirs[0].diff(ours)))
                    for name in found:
                        v = VARIANTS[name]
                        print(f"  ATTRIBUTED: KAI with variant {name} ({v.deviation}: {v.why}) "
                              "decides as kai-ray does; going on with kai-ray's decisions")
            snap = arrivals(next_snapshot(snap, ours), seed, r)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="KAI runs per snapshot")
    parser.add_argument("--procs", type=int, default=8, help="harness processes side by side")
    parser.add_argument("--core", choices=("auto", "python", "native"), default="auto")
    parser.add_argument("--keep", type=pathlib.Path,
                        help="write each diverging snapshot's harness JSON here")
    parser.add_argument("--known", type=pathlib.Path, metavar="YAML",
                        help="rewrite this list of known differences from the run "
                             "(tests/kai_fuzz_known.yaml: causes kept, fixed seeds dropped)")
    parser.add_argument("--only", metavar="SEED,SEED,...",
                        help="run these seeds instead of a range (e.g. a full run's diverging "
                             "ones again after a change)")
    parser.add_argument("--show", type=int, metavar="SEED", help="print one seed in full")
    parser.add_argument("--kai-log", type=int, metavar="LEVEL",
                        help="with --show: write KAI's own log at this verbosity (7: scores)")
    args = parser.parse_args(argv)
    if args.show is not None:
        show(args.show, args.rounds, args.core, args.kai_log)
        return 0
    if args.only:
        try:
            seeds: Sequence[int] = sorted({int(s) for s in args.only.split(",")})
        except ValueError:
            parser.error(f"--only: comma-separated seed numbers, not {args.only!r}")
        named = ",".join(map(str, seeds))
    else:
        seeds = range(args.first, args.first + args.seeds)
        named = f"{seeds[0]}..{seeds[-1]}" if seeds else "none"
    print(f"KAI-scheduler {kai_version()} against kai_ray's core ({args.core}): seeds "
          f"{named}, {args.rounds} rounds, {args.runs} KAI runs each")
    outcomes = fuzz(list(seeds), args.rounds, args.runs, args.procs, args.core, args.keep)
    if args.known is not None:
        update_known(args.known, outcomes)
    return report(outcomes)


def update_known(path: pathlib.Path, outcomes: list[Outcome]) -> None:
    """Rewrite the list of known differences (tests/kai_fuzz_known.yaml) from this run: a seed
    that still differs keeps its cause, a new one gets its first difference to attribute, one
    that no longer differs goes."""
    import yaml

    head, old = "", {}
    if path.exists():
        text = path.read_text()
        head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        old = {int(k): v for k, v in (yaml.safe_load(text).get("seeds") or {}).items()}
    seeds = {}
    for o in outcomes:  # attributed rounds are proven deviations: only what is left is listed
        if o.divergence:
            seeds[o.seed] = old.get(o.seed) or (f"not yet attributed (round {o.diverged_round}: "
                                                f"{o.divergence[0]})")
    body = yaml.safe_dump({"seeds": seeds}, width=100, sort_keys=True)
    path.write_text(head + body)
    print(f"{path}: {len(seeds)} seeds ({len(set(seeds) - set(old))} new, "
          f"{len(set(old) - set(seeds))} gone)", file=sys.stderr)


def deviations(names: Sequence[str]) -> str:
    """The documented deviations a variant set stands for, e.g. "DEV-02+DEV-03" (each once:
    two variants may prove one deviation)."""
    return "+".join(dict.fromkeys(VARIANTS[n].deviation for n in names))


def attribution_counts(outcomes: Iterable[Outcome]) -> dict[str, tuple[int, int]]:
    """Per deviation (or set of them): the seeds and the rounds attributed to it."""
    seeds: dict[str, set[int]] = {}
    rounds: dict[str, int] = {}
    for o in outcomes:
        for _, names in o.attributed:
            key = deviations(names)
            seeds.setdefault(key, set()).add(o.seed)
            rounds[key] = rounds.get(key, 0) + 1
    return {k: (len(seeds[k]), rounds[k]) for k in sorted(seeds)}


def report(outcomes: list[Outcome]) -> int:
    """Prints the run's differences and sums; nonzero when a round differs from KAI by more
    than a documented deviation, or the harness refused a snapshot."""
    diverged = [o for o in outcomes if o.divergence]
    errors = [o for o in outcomes if o.error]
    for o in diverged:
        print(f"seed {o.seed} round {o.diverged_round}:\n    " + "\n    ".join(o.divergence))
    for o in errors:
        print(f"seed {o.seed}: {o.error}")
    panics = [o for o in outcomes if o.kai_panic]
    for o in panics:
        print(f"seed {o.seed}: {o.kai_panic.splitlines()[0]}")
    rounds = sum(o.rounds for o in outcomes)
    print(f"{len(outcomes)} seeds, {rounds} rounds identical ({sum(o.decided for o in outcomes)}"
          f" decisions), {len(diverged)} seeds diverged (not attributed), {len(errors)} errors, "
          f"KAI's code panicked on {len(panics)}; KAI's own runs "
          f"differed in {sum(o.kai_varied for o in outcomes)} rounds; KAI took back "
          f"{sum(o.taken_back for o in outcomes)} pods it pipelined in the same cycle and "
          f"{sum(o.bound_taken_back for o in outcomes)} it bound")
    counts = attribution_counts(outcomes)
    for key in counts:  # which rounds, as seed/round: `--show SEED` replays one
        print(f"{key}: " + ", ".join(f"{o.seed}/{r}" for o in outcomes
                                     for r, names in o.attributed if deviations(names) == key))
    print("rounds that differ only by a documented deviation (docs/kai-deviations.md): "
          + (", ".join(f"{k} {n} seeds/{r} rounds" for k, (n, r) in counts.items())
             or "none"))
    return 1 if diverged or errors else 0


if __name__ == "__main__":
    sys.exit(main())
