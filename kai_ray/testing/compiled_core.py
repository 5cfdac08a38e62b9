"""A copy of kai_ray with the scheduling core compiled by mypyc, for benchmarks and tests.

`build()` compiles once per version of the core's source (cached under $KAI_RAY_CACHE, default
~/.cache/kai-ray, in compiled-core/<hash>) with the same `setup.py` the image build uses
(KAI_RAY_COMPILE=1), and copies the rest of kai_ray next to it on every call, so only the
compile is cached. Run code against it with `env(path)` (PYTHONPATH first: the copy shadows the
checkout's interpreted kai_ray).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import kai_ray

REPO = Path(kai_ray.__file__).resolve().parent.parent
_MARKER = ".compiled"


def _core_hash() -> str:
    """What the compiled modules depend on: the core's source, setup.py, mypyc and Python."""
    import mypy.version

    digest = hashlib.sha256()
    digest.update(f"{sys.version}|{mypy.version.__version__}".encode())
    for path in [REPO / "setup.py", *sorted((REPO / "kai_ray" / "core").rglob("*.py"))]:
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _copy_package(dest: Path) -> None:
    """kai_ray's Python files and data next to the compiled core (core .py files included:
    mypyc's modules import their own source tree's package layout)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    shutil.copytree(REPO / "kai_ray", dest / "kai_ray", ignore=ignore, dirs_exist_ok=True)
    for data in ("benchmarks", "tools"):  # found relative to the package (traces, binaries)
        link = dest / data
        if link.is_symlink() and link.resolve() != (REPO / data).resolve():
            link.unlink()  # made by another checkout that shares the cache
        if not link.is_symlink():
            link.symlink_to(REPO / data, target_is_directory=True)


def build(log: Callable[[str], None] = print) -> Path:
    """The directory to put first on PYTHONPATH; compiles the core if this version has not been
    compiled yet (about a minute on 2 cores). Raises RuntimeError with mypyc's errors if the
    compile fails."""
    if not (REPO / "setup.py").is_file():
        raise FileNotFoundError(f"{REPO / 'setup.py'}: compiling the core needs a source checkout")
    root = Path(os.environ.get("KAI_RAY_CACHE", Path.home() / ".cache" / "kai-ray"))
    final = root / "compiled-core" / _core_hash()
    if not (final / _MARKER).is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=final.parent))
        try:
            shutil.copy2(REPO / "setup.py", work)
            shutil.copy2(REPO / "pyproject.toml", work)
            shutil.copy2(REPO / "README.md", work)
            _copy_package(work)
            log(f"compiling kai_ray/core with mypyc into {final} (about a minute)")
            proc = subprocess.run(
                [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=work,
                env={**os.environ, "KAI_RAY_COMPILE": "1"}, capture_output=True, text=True)
            if proc.returncode != 0:
                errors = [line for line in (proc.stdout + proc.stderr).splitlines()
                          if ": error:" in line or line.startswith("error:")]
                raise RuntimeError(f"compiling the core with mypyc failed (exit "
                                   f"{proc.returncode}):\n" + "\n".join(
                                       errors or (proc.stdout + proc.stderr).splitlines()[-30:]))
            publish(work, final, _MARKER, _core_hash())
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    _copy_package(final)  # the rest of kai_ray as it is now
    prune(final.parent, keep=final)
    return final


def publish(work: Path, final: Path, marker: str, version: str) -> None:
    """Mark the finished build in `work` and move it to `final` in one rename (a build that
    another process finished first wins; `work` goes)."""
    (work / marker).write_text(version + "\n")
    if final.exists():
        shutil.rmtree(work)
    else:
        os.replace(work, final)


def prune(root: Path, keep: Path, versions: int = 3, marker: str = _MARKER) -> None:
    """Drop all but the `versions` most recently used builds under `root` (those holding
    `marker`; each is a few MB, one per edit of the core otherwise piles up)."""
    os.utime(keep)
    done = sorted((p for p in root.iterdir() if (p / marker).is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in done[versions:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def env(path: Path) -> dict[str, str]:
    """The environment for a subprocess that runs kai_ray from `path` (see `build`; the
    native core's builds go the same way)."""
    previous = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(path) + (os.pathsep + previous if previous else "")}


def running_compiled() -> bool:
    """Whether this process runs the compiled core."""
    from kai_ray import core

    return core.COMPILED
