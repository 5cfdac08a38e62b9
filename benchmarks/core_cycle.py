"""One full scheduling cycle (snapshot compile + all actions) on synthetic clusters.

    python benchmarks/core_cycle.py [--sizes 100 1000 5000] [--repeat 5]

Prints the median wall time of `schedule()` per size (and its median CPU time, which other load
on the machine disturbs less), and per action.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from kai_ray.core.schedule import schedule
from kai_ray.sim.synthetic import cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'nodes':>6} {'pods':>7} {'pending':>8} {'median s':>9} {'min s':>7} {'cpu s':>7}  "
          "per action (median wall s)")
    for size in args.sizes:
        snap = cluster(size)
        pods = sum(len(j.pods) for j in snap.jobs)
        pending = sum(1 for j in snap.jobs for p in j.pods if p.node is None)
        times, cpu, actions = [], [], []
        bound = 0
        for _ in range(args.repeat):
            start, cpu_start = time.perf_counter(), time.process_time()
            result = schedule(snap, now=0.0, clock=time.perf_counter)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            actions.append(result.action_seconds)
            bound = len(result.binds)
            print(f"  {size} nodes: {times[-1]:.3f} s", file=sys.stderr)
        per_action = {a: statistics.median(x[a] for x in actions) for a in actions[0]}
        detail = ", ".join(f"{a} {v:.3f}" for a, v in per_action.items())
        print(f"{size:>6} {pods:>7} {pending:>8} {statistics.median(times):>9.3f} "
              f"{min(times):>7.3f} {statistics.median(cpu):>7.3f}  {detail}; binds {bound}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
