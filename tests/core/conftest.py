"""Which core a test of the scheduling core runs, said in its id: `each_core` runs the test
once on the Python core (the specification) and once on the Rust core (the engine), so a
behaviour test never depends on whether the Rust module happened to be importable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kai_ray.core import schedule as core_schedule
from kai_ray.core.schedule import Core
from kai_ray.testing import native_core


@pytest.fixture(scope="module", params=["python", "native"])
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
