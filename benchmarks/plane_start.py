"""Warm start time of the local control plane (not a test: a measurement).

    python3 benchmarks/plane_start.py [--runs 5] [--nodes 4] [-o json]

Each run starts etcd + kube-apiserver + kube-controller-manager + KWOK from the built binaries
(tools/cluster/build.sh), installs kai-ray's CRDs, waits for the controller-manager's first
ServiceAccount ("ready"), then creates --nodes KWOK GPU nodes and waits until they are Ready and
untainted ("nodes ready"), and stops everything. One warm-up run is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kai_ray.testing.plane import ControlPlane


def one_run(nodes: int) -> dict[str, float]:
    t0 = time.monotonic()
    plane = ControlPlane()
    try:
        plane.start()
        timings = dict(plane.timings)
        if nodes:
            plane.add_gpu_nodes(nodes, 8)
        timings["nodes_ready"] = time.monotonic() - t0
    finally:
        t1 = time.monotonic()
        plane.stop()
        timings["stop"] = time.monotonic() - t1
    return timings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()

    one_run(args.nodes)  # warm-up: page cache, Python imports
    runs = [one_run(args.nodes) for _ in range(args.runs)]
    keys = ["apiserver_ready", "crds_ready", "ready", "nodes_ready", "stop"]
    summary = {k: {"median": statistics.median(r[k] for r in runs),
                   "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
               for k in keys}
    if args.output == "json":
        print(json.dumps({"runs": runs, "summary": summary, "nodes": args.nodes}, indent=2))
        return 0
    print(f"control plane warm start, {args.runs} runs (+1 warm-up), {args.nodes} GPU nodes")
    print(f"{'phase (seconds from start)':<28} {'median':>7} {'min':>7} {'max':>7}")
    for k in keys:
        s = summary[k]
        print(f"{k:<28} {s['median']:>7.2f} {s['min']:>7.2f} {s['max']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
