"""One `schedule()` call on the synthetic cluster of N nodes (default 1,000), for profilers.

    python benchmarks/one_cycle.py [NODES] [--busy] [--native]

`--busy` takes the mostly running cluster (`kai_ray.sim.synthetic.busy_cluster`) instead of the
issue's workload (`cluster`). `--native` runs the Rust core (built if need be,
kai_ray/testing/native_core.py); otherwise the Python core runs, whatever is on sys.path.

Prints which core ran (native or Python), the CPU seconds, binds and evictions, and a
digest of every decision and explanation (binds with nodes and devices, evictions with their
messages, pipelined pods, job statuses, queue shares, every pod's outcome): equal digests at
two commits mean the same decisions. Under
callgrind it gives a count of instructions that does not drift with the machine's speed, which
is how to compare two versions of a core on a machine whose speed varies:

    PY=$(python3 -c 'import sys; print(sys.executable)')   # the interpreter, not a shim
    valgrind --tool=callgrind --callgrind-out-file=cg.out $PY benchmarks/one_cycle.py 1000 --native
    callgrind_annotate --inclusive=yes cg.out | head
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

from kai_ray.core.result import CycleResult
from kai_ray.core.schedule import schedule
from kai_ray.sim.synthetic import busy_cluster, cluster
from kai_ray.testing import native_core


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nodes", type=int, nargs="?", default=1000)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--native", action="store_true")
    args = parser.parse_args()
    size = args.nodes
    snapshot = (busy_cluster if args.busy else cluster)(size)
    start = time.process_time()
    if args.native:
        native_core.use(native_core.build(log=lambda m: print(m, file=sys.stderr)))
    result = schedule(snapshot, now=0.0, core="native" if args.native else "python")
    name = "native (Rust)" if args.native else "Python"
    print(f"core: {name}; {size} "
          f"{'busy ' if args.busy else ''}nodes: "
          f"{time.process_time() - start:.3f} s CPU, {len(result.binds)} binds, "
          f"{len(result.evictions)} evictions, decisions {digest(result)}")
    return 0


def digest(result: CycleResult) -> str:
    lines = [f"B {b.job} {b.pod} {b.node} {b.gpu_groups} {b.new_gpu_groups} {b.gpu_portion}"
             for b in result.binds]
    lines += [f"E {e.job} {e.pod} {e.node} {e.action} {e.preemptor} {e.message}"
              for e in result.evictions]
    lines += [f"P {p.job} {p.pod} {p.node}" for p in result.pipelined]
    lines += [f"S {n} {s.reason} {s.message}" for n, s in sorted(result.job_status.items())]
    lines += [f"Q {n} {q.allocated} {q.fair_share}" for n, q in sorted(result.queues.items())]
    lines += [f"O {n} {o.status} {o.node} {o.gpu_groups}" for n, o in sorted(result.pods.items())]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
