"""The Rust core's modules form no circle, as the Python core's import contracts require of its
own (pyproject.toml, `acyclic_siblings`): each module of native/core/src may use only modules
that do not use it back, directly or through others. Read from the sources: every `crate::`
path and `use crate::{...}` item, and `super::` inside a module directory."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "native" / "core" / "src"


def _modules() -> dict[str, str]:
    """Module path ("state", "actions::solver") -> source without comments."""
    out = {}
    for path in SRC.rglob("*.rs"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = "::".join(parts[:-1] if parts[-1] == "mod" else parts)
        if name != "lib":
            out[name] = re.sub(r"//.*", "", path.read_text())
    return out


def _longest_module(path: str, modules: dict[str, str]) -> str | None:
    parts = [p.strip() for p in path.split("::") if p.strip()]
    for k in range(len(parts), 0, -1):
        candidate = "::".join(parts[:k])
        if candidate in modules:
            return candidate
    return None


def dependencies(modules: dict[str, str]) -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {}
    for name, text in modules.items():
        found = set()
        paths = [m.group(1) for m in re.finditer(r"crate::((?:\w+::)*\w+)", text)]
        for group in re.finditer(r"use crate::\{(.*?)\};", text, re.S):
            # one level of braces is enough for this crate's imports
            flat = re.sub(r"(\w+)::\{([^}]*)\}",
                          lambda m: ",".join(f"{m.group(1)}::{i}" for i in m.group(2).split(",")),
                          group.group(1))
            paths.extend(flat.split(","))
        parent = name.rsplit("::", 1)[0] if "::" in name else ""
        paths.extend(f"{parent}::{m.group(1)}" if parent else m.group(1)
                     for m in re.finditer(r"super::(\w+)", text))
        for path in paths:
            module = _longest_module(path, modules)
            if module is not None and module != name:
                found.add(module)
        deps[name] = found
    return deps


def test_the_parser_sees_the_uses_the_crate_has() -> None:
    """Known edges, so an empty graph cannot pass for an acyclic one."""
    deps = dependencies(_modules())
    assert "placement" in deps["actions::common"]
    assert "packing" in deps["placement"]
    assert "state" in deps["ordering"]
    assert "actions::victims" in deps["actions::solver"]


def test_no_module_circles() -> None:
    deps = dependencies(_modules())
    try:
        order = list(graphlib.TopologicalSorter(deps).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"Rust modules in a circle: {' -> '.join(err.args[1])}") from None
    assert len(order) == len(deps)


def test_a_circle_is_found() -> None:
    """The check itself: a use back from `state` to `ordering` is reported."""
    modules = _modules()
    modules["state"] += "\nuse crate::ordering::PendingOrder;\n"
    deps = dependencies(modules)
    try:
        list(graphlib.TopologicalSorter(deps).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle through state and ordering went unnoticed")
