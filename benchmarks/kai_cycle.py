"""One scheduling cycle of NVIDIA's KAI scheduler (Go) on the synthetic clusters of core_cycle.py.

    python benchmarks/kai_cycle.py [--sizes 100 1000 5000] [--repeat 3] [--core] [--keep DIR]
                                   [--timeout SECONDS] [--actions allocate consolidation ...]
                                   [--kai-source DIR] [--compare]

Writes `kai_ray.sim.synthetic.cluster(N)` as JSON (schema: benchmarks/kai_go/cluster.go), runs
the Go harness benchmarks/kai_go (KAI-scheduler's own actions and default plugins, in a session
built with KAI's test utilities) on it, and prints per size the median of --repeat runs: session
build (the snapshot), each action, the total, and the binds / pipelined pods / evictions the
cycle made (counted from the calls to KAI's cache mock). `--core` also runs kai_ray's core once
on the same cluster for its counts; `--compare` compares KAI's decisions with the core's pod by
pod. `--timeout` stops a run whose actions take longer (KAI's
actions cannot be interrupted: the harness exits) and reports the unfinished action as "> s".
The first run downloads and compiles the KAI module and
Kubernetes (minutes, about 1 GB of Go caches); later runs reuse Go's build cache.
Environment passed to the harness: KAI_CYCLE_PARAMS=test keeps the scheduler parameters of KAI's
test sessions instead of the scheduler's command-line defaults. `--kai-source DIR` builds the
harness against a KAI-scheduler source tree (a `replace` directive in a copy of the harness), to
time a KAI version the module proxy does not serve or a patched one.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from kai_ray.core.model import PodStatus, Snapshot
from kai_ray.sim.synthetic import cluster
from kai_ray.testing.kai_harness import (
    HarnessMissing,
    build_harness,
    harness_dir,
    kai_version,
    snapshot_json,
)

ACTIONS = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
PREFIX = "KAI_CYCLE_RESULT "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--core", action="store_true",
                        help="also run kai_ray's core once per size for its counts")
    parser.add_argument("--keep", type=pathlib.Path,
                        help="write the cluster JSON and KAI's decisions into this directory")
    parser.add_argument("--timeout", type=float,
                        help="seconds of actions per run before the harness stops")
    parser.add_argument("--actions", nargs="+", choices=ACTIONS, default=list(ACTIONS))
    parser.add_argument("--compare", action="store_true",
                        help="compare KAI's decisions with kai_ray's core, pod by pod")
    parser.add_argument("--kai-source", type=pathlib.Path,
                        help="a KAI-scheduler source tree to build against instead of go.mod's")
    args = parser.parse_args()
    if args.kai_source is not None and not (args.kai_source / "go.mod").is_file():
        parser.error(f"--kai-source: {args.kai_source} has no go.mod")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be > 0")
    try:
        binary = build_harness(args.kai_source)
    except HarnessMissing as err:
        raise SystemExit(f"kai_cycle: {err}") from err
    source = f" replaced by {args.kai_source.resolve()}" if args.kai_source else ""
    print(f"KAI-scheduler {kai_version()}{source}, actions {', '.join(args.actions)}; "
          f"params {os.environ.get('KAI_CYCLE_PARAMS') or 'scheduler'}"
          + (f"; timeout {args.timeout:g} s of actions per run" if args.timeout else ""))
    print(f"{'nodes':>6} {'pods':>7} {'pending':>8} {'session s':>9} {'total s':>8} {'min s':>7}"
          f"  per action (median s); KAI binds / pipelined / evictions")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or pathlib.Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            snap = cluster(size)
            path = out / f"cluster_{size}.json"
            path.write_text(json.dumps(snapshot_json(snap)))
            decisions = out / f"kai_decisions_{size}.json"
            runs = run_harness(binary, path, args.repeat,
                               decisions if args.keep or args.compare else None,
                               args.timeout, args.actions)
            print_row(runs)
            if args.compare and not runs[-1].get("timed_out"):
                print("        " + compare(snap, json.loads(decisions.read_text())))
            if args.core:
                print("        " + core_counts(snap))
            sys.stdout.flush()
    return 0


def run_harness(binary: pathlib.Path, path: pathlib.Path, repeat: int,
                decisions: pathlib.Path | None, timeout: float | None,
                actions: list[str]) -> list[dict[str, Any]]:
    """The harness's results, one per run; after a run that timed out it has exited, so the
    remaining runs are not made."""
    env = {**os.environ, "KAI_CYCLE_JSON": str(path), "KAI_CYCLE_REPEAT": str(repeat),
           "KAI_CYCLE_ACTIONS": ",".join(actions)}
    if decisions is not None:
        env["KAI_CYCLE_DECISIONS"] = str(decisions)
    if timeout is not None:
        env["KAI_CYCLE_TIMEOUT"] = str(timeout)
    print(f"  running KAI on {path.name} x{repeat}...", file=sys.stderr)
    proc = subprocess.Popen([str(binary), "-test.run", "^TestKAICycle$", "-test.v",
                             "-test.timeout", "0"], cwd=harness_dir(), env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    runs, other = [], []
    for line in proc.stdout:
        if line.startswith(PREFIX):
            runs.append(json.loads(line[len(PREFIX):]))
            late = f" ({runs[-1]['timed_out']} timed out)" if runs[-1].get("timed_out") else ""
            print(f"    total {runs[-1]['total_s']:.3f} s{late}", file=sys.stderr)
        else:
            other.append(line)
    timed_out = bool(runs) and bool(runs[-1].get("timed_out"))
    if proc.wait() != 0 or (len(runs) != repeat and not timed_out):
        raise SystemExit(f"kai_cycle: the harness failed on {path}:\n{''.join(other[-50:])}")
    return runs


def print_row(runs: list[dict[str, Any]]) -> None:
    """Medians over the runs; a run that timed out is the last one, and its unfinished action
    and total print as lower bounds ("> s")."""
    first = runs[-1]
    late = "> " if first.get("timed_out") else ""

    def med(get: Any) -> float:
        return statistics.median(get(r) for r in runs)

    def action_time(i: int, a: dict[str, Any]) -> str:
        if a.get("timed_out"):
            return f"{a['name']} > {a['seconds']:.1f} (unfinished)"
        return f"{a['name']} {med(lambda r: r['actions'][i]['seconds']):.3f}"

    per_action = ", ".join(action_time(i, a) for i, a in enumerate(first["actions"]))
    counts = {(r["binds"], r["pipelined"], r["evictions"]) for r in runs}
    varies = "" if len(counts) == 1 else f" (runs differ: {sorted(counts)})"
    total = f"{late}{med(lambda r: r['total_s']):.3f}"
    print(f"{first['nodes']:>6} {first['pods']:>7} {first['pending']:>8} "
          f"{med(lambda r: r['session_s']):>9.3f} {total:>8} "
          f"{min(r['total_s'] for r in runs):>7.3f}  {per_action}; "
          f"{first['binds']} / {first['pipelined']} / {first['evictions']}"
          f"{' (finished actions)' if late else ''}{varies}")
    split = (f"objects {med(lambda r: r['objects_s']):.3f} + plugins open "
             f"{med(lambda r: r['open_s']):.3f} s (cache mock {med(lambda r: r['mock_s']):.3f} s "
             "not counted)" if first["objects_s"] >= 0 else "not split")
    by_action = ", ".join(f"{a['name']} {a['binds']}/{a['pipelined']}/{a['evictions']}"
                          for a in first["actions"] if a["binds"] or a["pipelined"]
                          or a["evictions"])
    final = ", ".join(f"{k} {v}" for k, v in sorted(first["final_status"].items()))
    print(f"        session: {split}; binds/pipelined/evictions by action: "
          f"{by_action or 'none'}"
          + (f"; final pod statuses: {final}" if final else "")
          + f"; harness peak RSS {first['peak_rss_mib']:.0f} MiB")


def compare(snap: Snapshot, kai: dict[str, Any]) -> str:
    """KAI's decisions (the harness names a pod `<job>-<index in the job>`) against kai_ray's
    core on the same snapshot."""
    from kai_ray.core.schedule import schedule

    ours = schedule(snap, now=0.0)
    names = {f"{job.name}-{i}": pod for job in snap.jobs for i, pod in enumerate(job.pods)}
    unknown = [n for n, *_ in kai["binds"] + kai["pipelined"] if n not in names] + [
        n for n in kai["evictions"] if n not in names]
    if unknown:
        raise SystemExit(f"kai_cycle: KAI decided on pods not in the snapshot: {unknown[:5]}")
    our_binds = {b.pod: b.node for b in ours.binds}
    same_node = sum(1 for n, node, *_ in kai["binds"] if our_binds.get(names[n].name) == node)
    kai_pipelined = {names[n].name for n, *_ in kai["pipelined"]}
    our_pipelined = {p.pod for p in ours.pipelined}
    evicted = {names[n].name: names[n] for n in kai["evictions"]}
    running = {n for n, pod in evicted.items() if pod.status == PodStatus.RUNNING}
    our_evicted = {e.pod for e in ours.evictions}
    return (f"vs kai_ray's core: binds on the same node {same_node} of KAI's {len(kai['binds'])}"
            f" (ours {len(our_binds)}); pipelined: {len(our_pipelined & kai_pipelined)} of our "
            f"{len(our_pipelined)} among KAI's {len(kai_pipelined)}; evicted running pods: "
            f"{len(running & our_evicted)} of KAI's {len(running)} also ours (ours "
            f"{len(our_evicted)}); KAI also evicted {len(evicted) - len(running)} pods pending "
            f"in the snapshot, and made {len(kai['evictions']) - len(evicted)} repeated "
            "eviction calls")


def core_counts(snap: Snapshot) -> str:
    from kai_ray.core.schedule import schedule

    start = time.perf_counter()
    result = schedule(snap, now=0.0)
    took = time.perf_counter() - start
    return (f"kai_ray core (interpreted, {took:.1f} s): binds {len(result.binds)}, pipelined "
            f"{len(result.pipelined)}, evictions {len(result.evictions)}")


if __name__ == "__main__":
    sys.exit(main())
