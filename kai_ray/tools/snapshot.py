"""`kai-ray snapshot`: the live cluster written as a scenario file (docs/scenario-format.md plus
the optional live fields of kai_ray/sim/scenario.py) that `kai-ray simulate` replays."""


from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from kai_ray.core.result import CycleResult
from kai_ray.sim.scenario_write import in_file_order, scenario_of
from kai_ray.tools.live import read_cluster, scheduler_config


def predicted(result: CycleResult) -> dict[str, Any]:
    """What one cycle decides for pending pods: binds and pending reasons (for comparisons)."""
    return {"binds": {f"{b.namespace}/{b.pod}": b.node for b in result.binds},
            "pending": {s.job: s.reason for s in result.job_status.values()}}


def cmd_snapshot(args: argparse.Namespace) -> int:
    live = read_cluster(args.kubeconfig, getattr(args, "config", None))
    config = scheduler_config(getattr(args, "config", None))
    for p in live.problems:
        print(f"kai-ray snapshot: left out: {p}", file=sys.stderr)
    doc = {"x-kai-ray-snapshot": {"problems": [str(p) for p in live.problems]},
           "scenarios": [scenario_of(in_file_order(live.snapshot), config, live.taken)]}
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    if args.file in ("-", None):
        sys.stdout.write(text)
    else:
        Path(args.file).write_text(text)
        counts = (len(live.snapshot.nodes), len(live.snapshot.queues), len(live.snapshot.jobs))
        print(f"wrote {args.file}: {counts[0]} nodes, {counts[1]} queues, {counts[2]} jobs",
              file=sys.stderr)
    return 0

