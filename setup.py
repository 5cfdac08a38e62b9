"""Packaging hook: with KAI_RAY_COMPILE=1 the scheduling core (kai_ray/core) is compiled to C with
mypyc, the way black and mypy ship. The same source runs interpreted otherwise (an editable
install never compiles, so an edited .py file is never shadowed by a stale .so). The core is
`mypy --strict` clean, which is what mypyc needs; tests/core/test_compiled_core.py checks that
the compiled core takes the same decisions."""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup


def core_modules() -> list[str]:
    """The modules mypyc compiles: every module of the scheduling core."""
    root = Path(__file__).resolve().parent
    return sorted(str(p.relative_to(root)) for p in (root / "kai_ray" / "core").rglob("*.py"))


def _extensions() -> list[object]:
    if os.environ.get("KAI_RAY_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify  # a build requirement only when compiling
    except ImportError as exc:
        raise SystemExit("KAI_RAY_COMPILE=1: mypyc (pip install mypy) and a C compiler are "
                         "needed in the build environment; build with "
                         "`pip wheel --no-build-isolation .`") from exc

    return list(mypycify(core_modules(), opt_level="3"))


setup(ext_modules=_extensions())
