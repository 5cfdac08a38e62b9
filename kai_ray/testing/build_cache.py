"""Builds cached under $KAI_RAY_CACHE (default ~/.cache/kai-ray), one directory per version of
their sources (the Rust core: kai_ray.testing.native_core; the images: kai_ray.testing.images):
how a finished build is published, how old ones are pruned, and the environment that runs
kai_ray from one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def publish(work: Path, final: Path, marker: str, version: str) -> None:
    """Mark the finished build in `work` and move it to `final` in one rename (a build that
    another process finished first wins; `work` goes)."""
    (work / marker).write_text(version + "\n")
    if final.exists():
        shutil.rmtree(work)
    else:
        os.replace(work, final)


def prune(root: Path, keep: Path, marker: str, versions: int = 3) -> None:
    """Drop all but the `versions` most recently used builds under `root` (those holding
    `marker`; each is a few MB, one per edit of the core otherwise piles up)."""
    os.utime(keep)
    done = sorted((p for p in root.iterdir() if (p / marker).is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in done[versions:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def env(path: Path) -> dict[str, str]:
    """The environment for a subprocess that runs kai_ray from `path` (put first on PYTHONPATH)."""
    previous = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(path) + (os.pathsep + previous if previous else "")}
