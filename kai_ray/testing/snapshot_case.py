"""Print a fuzzer round's snapshot as a scenario case, to pin what the fuzzer found in a file.

    python3 -m kai_ray.testing.snapshot_case SEED ROUND [--id ID] [--run full_cycle]

prints one case for tests/scenarios/*.yaml: the snapshot `kai_fuzz --show SEED --rounds ROUND+1`
compares in its last round (the seed's cluster after ROUND rounds of kai-ray's decisions), with
no `expect` yet. It is written as `kai-ray snapshot` writes a live cluster
(kai_ray/sim/scenario_write.py), so it decides as the round did.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from kai_ray.core.model import SchedulerConfig, Snapshot
from kai_ray.core.schedule import schedule
from kai_ray.sim import scenario
from kai_ray.sim.scenario_write import scenario_of
from kai_ray.testing import kai_fuzz


def round_snapshot(seed: int, round_: int) -> Snapshot:
    """The fuzzer's snapshot of `seed` after `round_` rounds of kai-ray's decisions."""
    snap = kai_fuzz.random_snapshot(seed)
    for r in range(round_):
        ours = kai_fuzz.our_decisions(snap, schedule(snap, SchedulerConfig(), now=0.0))
        snap = kai_fuzz.arrivals(kai_fuzz.next_snapshot(snap, ours), seed, r)
    return snap


def case_of(snap: Snapshot, case_id: str, run: str = "full_cycle") -> dict[str, Any]:
    """`snap` as a scenario case under the fuzzer's configuration (the default one)."""
    case = scenario_of(snap, SchedulerConfig(), scenario.NOW)
    del case["title"], case["source"]
    return {**case, "id": case_id, "run": run}


def dump(case: dict[str, Any]) -> str:
    """`case` as YAML for a scenario file's list."""
    text: str = yaml.safe_dump([case], sort_keys=False, default_flow_style=None, width=100)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.snapshot_case",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("seed", type=int)
    parser.add_argument("round", type=int, help="rounds of kai-ray's decisions applied first")
    parser.add_argument("--id", help="the case's id (default fuzz-SEED-ROUND)")
    parser.add_argument("--run", default="full_cycle", choices=list(scenario.RunKind.__args__))
    args = parser.parse_args(argv)
    case = case_of(round_snapshot(args.seed, args.round),
                   args.id or f"fuzz-{args.seed}-{args.round}", args.run)
    case["source"] = {"fuzzer": f"python3 -m kai_ray.testing.kai_fuzz --show {args.seed} "
                                f"--rounds {args.round + 1} (round {args.round})"}
    sys.stdout.write(dump(case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
