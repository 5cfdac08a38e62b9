"""Packaging hook: with KAI_RAY_NATIVE=1 the Rust core (native/, module kai_ray_native) is built
into the wheel with setuptools-rust, as the image does. Without it the wheel is pure Python and
schedules with the Python core, the specification (an editable install never builds, so an
edited file is never shadowed by a stale build; kai_ray.testing.native_core builds the Rust core
for local use). tests/core/test_native_core.py checks that the Rust core takes the Python
core's decisions."""

from __future__ import annotations

import os

from setuptools import setup


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


setup(rust_extensions=_rust_extensions())
