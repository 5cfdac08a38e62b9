"""The Rust core is as pure as the Python one (whose import contract is in pyproject.toml): the
crate `kai-ray-core` depends on nothing but a hash function, forbids unsafe code, and its
sources use no file, network, clock, environment, process, thread or randomness; the clock the
actions are timed with comes from the caller, as in `schedule(clock=...)`. Only the PyO3
bindings (native/python) touch Python."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent.parent / "native"
CORE = NATIVE / "core"
FORBIDDEN = re.compile(r"\bstd::(fs|net|io|time|env|process|thread)\b|\b(println|eprintln|print|"
                       r"eprint|dbg)!|\brand\b|\bpyo3\b|\bunsafe\b")


def _offends(line: str) -> bool:
    return bool(FORBIDDEN.search(line.split("//")[0]))  # comments may name anything


def test_core_crate_depends_on_nothing_but_a_hash_function() -> None:
    manifest = tomllib.loads((CORE / "Cargo.toml").read_text())
    assert set(manifest.get("dependencies", {})) == {"rustc-hash"}
    assert manifest["lints"]["rust"]["unsafe_code"] == "forbid"


def test_core_sources_do_no_io() -> None:
    sources = sorted((CORE / "src").rglob("*.rs"))
    assert len(sources) > 10
    found = [f"{path.relative_to(NATIVE)}:{n}: {line.strip()}"
             for path in sources
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if _offends(line)]
    assert not found, "\n".join(found)


def test_the_check_would_see_it() -> None:
    for line in ("use std::fs::File;", "let t = std::time::Instant::now();",
                 'eprintln!("x");', "unsafe { x }"):
        assert _offends(line), line
    assert not _offends("let instant = 3; // std::time in a comment")
