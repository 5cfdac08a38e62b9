"""A garbage collection long enough to hold the scheduling loop is said in the log."""

from __future__ import annotations

import gc
import logging

import pytest

from kai_ray.controller.logsetup import GcPauses


def _logged(caplog: pytest.LogCaptureFixture, pauses: GcPauses, generation: int) -> list[str]:
    pauses.install()
    try:
        with caplog.at_level(logging.INFO, logger="kai_ray"):
            gc.collect(generation)
    finally:
        pauses.uninstall()
    return [r.getMessage() for r in caplog.records if "garbage collection" in r.getMessage()]


def test_a_collection_over_the_threshold_is_logged_with_its_generation(
        caplog: pytest.LogCaptureFixture) -> None:
    pauses = GcPauses(threshold_s=0.0)
    lines = _logged(caplog, pauses, 2)
    assert any("generation 2 stopped the process for" in line for line in lines), lines
    assert pauses.longest_s > 0.0


def test_short_collections_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert _logged(caplog, GcPauses(threshold_s=60.0), 0) == []
