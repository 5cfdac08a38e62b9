"""Which core a test of the scheduling core runs, said in its id: `each_core` runs the test
once on the Python core (the specification) and once on the Rust core (the engine), so a
behaviour test never depends on whether the Rust module happened to be importable (in a source
checkout; see CORES_HERE)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kai_ray.core import schedule as core_schedule
from kai_ray.core.schedule import Core
from kai_ray.testing import native_core

# test_compiled_core runs tests/core again on the mypyc-compiled copy of kai_ray, to test the
# compiled Python core: that copy has no Rust sources, and only the Python core is its subject
CORES_HERE = ["python", "native"] if (native_core.NATIVE / "Cargo.toml").is_file() else ["python"]


@pytest.fixture(scope="module", params=CORES_HERE)
def each_core(request: pytest.FixtureRequest) -> Iterator[Core]:
    """The core `schedule` runs by default during the test: "python", then "native" (built if
    it is not: a missing Rust core fails the test, it is not skipped)."""
    core: Core = request.param
    if core == "native":
        native_core.use(native_core.build())
        assert core_schedule.native_core(refresh=True) is not None
    before = core_schedule.set_default_core(core)
    try:
        yield core
    finally:
        core_schedule.set_default_core(before)
