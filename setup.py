"""Packaging hook: with KAI_RAY_COMPILE=1 the Python scheduling core (kai_ray/core) is compiled to C
with mypyc, the way black and mypy ship; with KAI_RAY_NATIVE=1 the Rust core (native/, module
kai_ray_native) is built into the wheel with setuptools-rust, as the image does. The Python
source runs as it is otherwise (an editable install never compiles, so an edited file is never
shadowed by a stale build; kai_ray.testing.native_core builds the Rust core for local use).
tests/core/test_compiled_core.py and test_native_core.py check that both take the Python
core's decisions."""

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


def _rust_extensions() -> list[object]:
    if os.environ.get("KAI_RAY_NATIVE") != "1":
        return []
    try:
        from setuptools_rust import Binding, RustExtension  # a build requirement only then
    except ImportError as exc:
        raise SystemExit("KAI_RAY_NATIVE=1: setuptools-rust (pip install setuptools-rust) and a "
                         "Rust toolchain (https://rustup.rs) are needed in the build environment; "
                         "build with `pip wheel --no-build-isolation .`") from exc

    return [RustExtension("kai_ray_native", path="native/python/Cargo.toml",
                          binding=Binding.PyO3, args=["--locked"])]


setup(ext_modules=_extensions(), rust_extensions=_rust_extensions())
