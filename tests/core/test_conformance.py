"""Every scenario in the project's scenario files passes through the real core."""

from pathlib import Path

import pytest

from kai_ray.sim import runner
from kai_ray.sim.scenario import load

SCENARIOS = Path(__file__).parent.parent / "scenarios"
CASES = [(f.name, s) for f in sorted(SCENARIOS.glob("*.yaml")) for s in load(f)]


@pytest.mark.parametrize(("file", "scenario"), CASES, ids=[f"{f}:{s.id}" for f, s in CASES])
def test_scenario(file, scenario):
    outcome = runner.run(scenario)
    assert runner.check(scenario, outcome) == []


def test_a_wrong_expectation_is_reported():
    scenario = next(s for _, s in CASES if s.id == "SEED-04")
    wrong = scenario.model_copy(update={"expect": {"distributed-training": {"status": "Pending"}}})
    problems = runner.check(wrong, runner.run(wrong))
    assert any("status Binding, expected Pending" in p for p in problems)
