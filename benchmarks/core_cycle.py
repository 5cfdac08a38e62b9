"""One full scheduling cycle (snapshot compile + all actions) on synthetic clusters.

    python benchmarks/core_cycle.py [--sizes 100 1000 5000] [--repeat 5] [--count-calls]
                                    [--native] [--busy] [--no-actions]
                                    [--gpu-packing POLICY] [--compare]

`--no-actions` runs the cycle without its actions (`SchedulerConfig.actions = ()`): the fixed
part, reading the snapshot, building the session and fair share, and the result.

`--gpu-packing` sets `SchedulerConfig.gpu_packing` (default "kai"; e.g. "lookahead": GPU pods
placed by that packing policy of kai_ray.core.packing, in either core).

`--compare` (with `--native`) also runs the Python core on each cluster, untimed, and says
whether every field of the two results is equal (the comparison of tests/core/test_native_core.py).

`--busy` runs the mostly running clusters of `kai_ray.sim.synthetic.busy_cluster` (27 pods
per node, 42 pending pods, shaped like KAI-Scheduler#315) instead of the issue's workload.

Prints the median wall time of `schedule()` per size (and its median CPU time, which other load
on the machine disturbs less), and per action. `--count-calls` (Python core only) also counts,
per action, the victim searches (`Solver.solve`), their prefixes and simulated scenarios, and
the node choices (`choose`) of one cycle: where the time goes, independent of machine load.
`--native` runs the Rust core (native/, built once per version of its sources with cargo;
kai_ray/testing/native_core.py), timed the same way: `schedule()` from the Python snapshot to the
Python CycleResult, as the scheduler runs it. The first line of output says which core ran.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import statistics
import sys
import time

from kai_ray.core import packing, placement
from kai_ray.core.actions import solver
from kai_ray.core.model import SchedulerConfig
from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import Core, schedule
from kai_ray.sim.synthetic import busy_cluster, cluster
from kai_ray.testing import native_core


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--count-calls", action="store_true")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--no-actions", action="store_true")
    parser.add_argument("--gpu-packing", default="kai", choices=packing.POLICIES)
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    if args.compare and not args.native:
        parser.error("--compare compares the native core with the Python one: with --native")
    if args.native and args.count_calls:
        parser.error("--count-calls wraps Python functions: not with --native")
    core: Core = "native" if args.native else "python"
    if args.native:
        native_core.use(native_core.build(log=lambda m: print(m, file=sys.stderr)))
    name = "native (Rust)" if args.native else "Python"
    print(f"core: {name}" + ("; busy clusters" if args.busy else "")
          + (f"; gpu_packing {args.gpu_packing}" if args.gpu_packing != "kai" else ""))
    counts: collections.Counter[str] = collections.Counter()
    if args.count_calls:
        _count(counts)
    config = SchedulerConfig(gpu_packing=args.gpu_packing)
    if args.no_actions:
        config = dataclasses.replace(config, actions=())
    print(f"{'nodes':>6} {'pods':>7} {'pending':>8} {'median s':>9} {'min s':>7} {'cpu s':>7}  "
          "per action (median wall s)")
    for size in args.sizes:
        snap = (busy_cluster if args.busy else cluster)(size)
        pods = sum(len(j.pods) for j in snap.jobs)
        pending = sum(1 for j in snap.jobs for p in j.pods if p.node is None)
        times, cpu, actions = [], [], []
        bound = 0
        for _ in range(args.repeat):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = schedule(snap, config, now=0.0, clock=time.perf_counter, core=core)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            actions.append(result.action_seconds)
            bound = len(result.binds)
            print(f"  {size} nodes: {times[-1]:.3f} s", file=sys.stderr)
        per_action = {a: statistics.median(x[a] for x in actions) for a in actions[0]} if (
            actions[0]) else {}
        detail = ", ".join(f"{a} {v:.3f}" for a, v in per_action.items())
        print(f"{size:>6} {pods:>7} {pending:>8} {statistics.median(times):>9.3f} "
              f"{min(times):>7.3f} {statistics.median(cpu):>7.3f}  {detail}; binds {bound}, "
              f"evictions {len(result.evictions)}")
        if args.compare:
            python_result = schedule(snap, config, now=0.0, core="python")
            differ = _differing(result, python_result)
            print("        Python core: " + (f"DIFFERENT {', '.join(differ)}" if differ else
                                             "the same decisions (every field)"))
        if args.count_calls:
            print("        calls per cycle: " + ", ".join(
                f"{k} {v // args.repeat}" for k, v in sorted(counts.items())))
            counts.clear()
    return 0


def _differing(a: CycleResult, b: CycleResult) -> list[str]:
    """The fields of two cycle results that differ, in value or written form (timings aside)."""
    return [f.name for f in dataclasses.fields(a) if f.name != "action_seconds"
            and (getattr(a, f.name) != getattr(b, f.name)
                 or repr(getattr(a, f.name)) != repr(getattr(b, f.name)))]


def _count(counts: collections.Counter[str]) -> None:
    """Wrap the Python core's solver steps and node choices to count their calls (slows the
    cycle)."""
    def counted(owner: object, name: str, per_action: bool) -> None:
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def wrapper(*args: object, **kwargs: object) -> object:
            action = getattr(args[0], "action", "") if per_action else ""
            counts[f"{action}{':' if action else ''}{name.lstrip('_')}"] += 1
            return inner(*args, **kwargs)
        setattr(owner, name, wrapper)

    for name in ("solve", "_solve_prefix", "_try"):
        counted(solver.Solver, name, True)
    counted(placement, "choose", False)

if __name__ == "__main__":
    sys.exit(main())
