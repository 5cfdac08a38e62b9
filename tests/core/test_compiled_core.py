"""The core compiled by mypyc (what the image ships, setup.py with KAI_RAY_COMPILE=1) takes the
same decisions as the interpreted source: the conformance cases, the core's and the simulator's
own tests (property tests included) run against it, and full cycles on synthetic clusters are
compared decision by decision. The first run compiles (about a minute; cached per version of the
core's source under $KAI_RAY_CACHE)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kai_ray.testing import compiled_core, native_core

TESTS = Path(__file__).resolve().parent.parent

# one cycle's decisions as JSON, from whichever core the process imports
_DECISIONS = """
import json, sys
from kai_ray.core.schedule import schedule
from kai_ray.sim.report import vars_of
from kai_ray.sim.synthetic import busy_cluster, cluster
from kai_ray.testing.compiled_core import running_compiled
out = []
for kind, size, seed in json.loads(sys.argv[1]):
    r = schedule((busy_cluster if kind == "busy" else cluster)(size, seed=seed), now=0.0)
    out.append([[vars_of(b) for b in r.binds], [vars_of(p) for p in r.pipelined],
                [vars_of(e) for e in r.evictions], sorted(r.job_status.items())])
print(json.dumps({"compiled": running_compiled(), "decisions": out}, default=str))
"""
_CASES = [("issue", 60, 1), ("issue", 150, 2), ("issue", 400, 3), ("busy", 150, 1)]


# these compare the Python core with itself compiled: a built native core on PYTHONPATH (as
# scripts/test puts it) is taken off, or `schedule` would run it in both
@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    return native_core.without(compiled_core.env(compiled_core.build()))


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # -P and a neutral cwd: nothing may put the checkout's interpreted kai_ray first
    return subprocess.run([sys.executable, "-P", *args], env=env, cwd=TESTS.parent.parent,
                          capture_output=True, text=True, timeout=900)


def _decisions(env: dict[str, str]) -> dict[str, object]:
    proc = _run(["-c", _DECISIONS, json.dumps(_CASES)], env)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_full_cycles_take_the_same_decisions_compiled(compiled: dict[str, str]) -> None:
    native = _decisions(compiled)
    assert native["compiled"] is True  # the compiled modules really were the ones imported
    interpreted = _decisions(native_core.without(dict(os.environ)))  # the checkout's kai_ray
    assert interpreted["compiled"] is False
    assert interpreted["decisions"] == native["decisions"]
    assert any(case[2] for case in native["decisions"])  # evictions: the solver ran


def test_conformance_passes_compiled(compiled: dict[str, str]) -> None:
    files = sorted(str(p) for p in (TESTS / "scenarios").glob("*.yaml"))
    proc = _run(["-m", "kai_ray.cli", "conformance", *files], compiled)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")


def test_core_and_simulator_tests_pass_compiled(compiled: dict[str, str]) -> None:
    # test_fast_paths switches shortcuts off by patching module functions, which compiled
    # callers do not see; this file would recurse; the two Rust comparisons build the Rust
    # core from a checkout (the compiled copy has no native/)
    proc = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=append",
                 "--rootdir", str(TESTS.parent), "-c", str(TESTS.parent / "pyproject.toml"),
                 str(TESTS / "core"), str(TESTS / "sim"), str(TESTS / "test_sim_cli.py"),
                 "--ignore", str(TESTS / "core" / "test_fast_paths.py"),
                 "--ignore", str(TESTS / "core" / "test_native_core.py"),
                 # compares with the Rust core, which it builds from the checkout's native/
                 "--ignore", str(TESTS / "core" / "test_elastic_and_raised.py"),
                 "--ignore", str(TESTS / "core" / "test_kai_fuzz_found.py"),
                 "--ignore", __file__], compiled)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.strip().splitlines()[-1]


def test_the_benchmark_runs_the_compiled_core_when_asked() -> None:
    bench = TESTS.parent / "benchmarks" / "core_cycle.py"
    runs = {}
    for flag in ([], ["--compiled"]):
        proc = subprocess.run([sys.executable, str(bench), "--sizes", "40", "--repeat", "1",
                               *flag], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        runs[lines[0]] = lines[-1].split("binds")[1]  # binds and evictions
    assert set(runs) == {"core: interpreted", "core: compiled (mypyc)"}
    assert len(set(runs.values())) == 1  # the same decisions
    one = subprocess.run([sys.executable, "-P", str(TESTS.parent / "benchmarks" / "one_cycle.py"),
                          "40"], env=native_core.without(compiled_core.env(compiled_core.build())),
                         capture_output=True, text=True, timeout=900)
    assert one.returncode == 0 and one.stdout.startswith("core: compiled (mypyc); 40 nodes:")
