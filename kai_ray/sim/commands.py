"""`kai-ray conformance`, `simulate` and `demo`."""

from __future__ import annotations

import argparse
import sys

from kai_ray.sim import runner
from kai_ray.sim.scenario import ScenarioError, load


def cmd_conformance(args: argparse.Namespace) -> int:
    passed = failed = 0
    for path in args.files:
        try:
            scenarios = load(path)
        except (OSError, ScenarioError) as exc:
            print(f"FAIL {path}: {exc}")
            failed += 1
            continue
        for scenario in scenarios:
            try:
                outcome = runner.run(scenario)
                problems = runner.check(scenario, outcome)
            except ScenarioError as exc:
                problems = [str(exc)]
            if problems:
                failed += 1
                print(f"FAIL {scenario.id}: {scenario.title}")
                for p in problems:
                    print(f"     {p}")
            else:
                passed += 1
                print(f"ok   {scenario.id}: {scenario.title}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_simulate(args: argparse.Namespace) -> int:
    import json

    from kai_ray.sim.report import as_json, render_text

    try:
        scenarios = load(args.file)
    except (OSError, ScenarioError) as exc:
        print(f"kai-ray simulate: {exc}", file=sys.stderr)
        return 2
    total = 0.0
    docs = []
    for scenario in scenarios:
        try:
            outcome = runner.run(scenario)
        except ScenarioError as exc:
            print(f"kai-ray simulate: {args.file}: {exc}", file=sys.stderr)
            return 2
        total += outcome.schedule_seconds
        if args.output == "json":
            docs.append(as_json(scenario, outcome))
        else:
            print(render_text(scenario, outcome))
    if docs:
        print(json.dumps(docs if len(docs) > 1 else docs[0], indent=2, default=list))
    if args.timing:
        print(f"schedule: {total:.3f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from kai_ray.sim.demo import run_demo

    return run_demo()
