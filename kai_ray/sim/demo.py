"""`kai-ray demo`: the sample scenarios through the real core, with a placement report."""

from __future__ import annotations

from importlib import resources

from kai_ray.core.schedule import describe_core
from kai_ray.sim import runner
from kai_ray.sim.report import render_text
from kai_ray.sim.scenario import load


def demo_file() -> str:
    return str(resources.files("kai_ray.sim").joinpath("data/demo.yaml"))


def run_demo() -> int:
    scenarios = load(demo_file())
    failures = 0
    print("kai-ray demo: each scenario runs through the same scheduling core as the cluster "
          f"({describe_core()}).\n")
    for scenario in scenarios:
        outcome = runner.run(scenario)
        print(render_text(scenario, outcome))
        problems = runner.check(scenario, outcome)
        if problems:
            failures += 1
            print("UNEXPECTED: " + "; ".join(problems))
        else:
            print(f"as expected: {', '.join(scenario.expect)}")
        print()
    print(f"{len(scenarios) - failures} of {len(scenarios)} scenarios behaved as expected")
    return 1 if failures else 0
