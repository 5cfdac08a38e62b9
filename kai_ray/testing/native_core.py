"""The Rust scheduling core (`native/`, Python module `kai_ray_native`), built for tests, the
benchmarks and local runs.

`build()` runs `cargo build --release` once per version of the Rust sources (cached under
$KAI_RAY_CACHE, default ~/.cache/kai-ray: cargo's target directory in native-targets/<checkout>/,
one per source checkout, the module in native/<hash>/) and returns the directory holding
`kai_ray_native.so`. Put it first on
PYTHONPATH (`env(path)`) or on sys.path (`use(path)`) and `kai_ray.core.schedule` runs it.
The image builds the same module into its wheel (setup.py, KAI_RAY_NATIVE=1).

    python3 -m kai_ray.testing.native_core        # builds if needed, prints the directory
    python3 -m kai_ray.testing.native_core --target-dir   # this checkout's cargo target dir
    export PYTHONPATH="$(python3 -m kai_ray.testing.native_core)${PYTHONPATH:+:$PYTHONPATH}"
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

import kai_ray
from kai_ray.testing.build_cache import env, prune, publish

__all__ = ["build", "env", "source_hash", "use", "without"]

REPO = Path(kai_ray.__file__).resolve().parent.parent
NATIVE = REPO / "native"
MODULE = "kai_ray_native"
_MARKER = ".built"


def cache_root() -> Path:
    return Path(os.environ.get("KAI_RAY_CACHE", Path.home() / ".cache" / "kai-ray"))


def target_dir() -> Path:
    """Cargo's target directory for this checkout. Not shared between checkouts: cargo decides
    that a crate is fresh by the modification times of the files its last build read, so after
    a build from another checkout it would take a checkout whose files are older (a worktree
    made earlier) for built, and hand back the other checkout's library."""
    checkout = hashlib.sha256(str(NATIVE).encode()).hexdigest()[:12]
    return cache_root() / "native-targets" / checkout


def _sources() -> list[Path]:
    files = [NATIVE / "Cargo.toml", NATIVE / "Cargo.lock"]
    for crate in ("core", "python"):
        files.append(NATIVE / crate / "Cargo.toml")
        files.extend(sorted((NATIVE / crate / "src").rglob("*.rs")))
    return files


def source_hash() -> str:
    """What the module depends on: the Rust sources, the lock file and this Python."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}|{sysconfig.get_platform()}".encode())
    for path in _sources():
        if path.is_file():
            digest.update(str(path.relative_to(REPO)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cargo() -> str:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).is_file():
        raise FileNotFoundError("cargo not found: the native core needs a Rust toolchain "
                                "(https://rustup.rs); the Python core runs without it")
    return cargo


def build(log: Callable[[str], None] = print) -> Path:
    """The directory to put first on PYTHONPATH; builds this version of the Rust core if it has
    not been built yet (about two minutes from nothing on 2 cores, seconds when cargo's
    target directory is warm). Raises RuntimeError with cargo's errors if the build fails."""
    if not (NATIVE / "Cargo.toml").is_file():
        raise FileNotFoundError(f"{NATIVE}: building the native core needs a source checkout")
    root = cache_root()
    final = root / "native" / source_hash()
    if (final / _MARKER).is_file():
        os.utime(final)
        return final
    target = target_dir()
    target.mkdir(parents=True, exist_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    # one build at a time per target directory, held until the library is copied: another
    # checkout building there could otherwise replace it between cargo and the copy, and its
    # code would be kept under this source's hash
    with open(target / ".kai-ray-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / _MARKER).is_file():
            return final  # built meanwhile
        log(f"building the native core (cargo, {NATIVE}) into {final}")
        env = {**os.environ, "CARGO_TARGET_DIR": str(target), "PYO3_PYTHON": sys.executable}
        proc = subprocess.run([_cargo(), "build", "--release", "--locked", "-p", "kai-ray-native"],
                              cwd=NATIVE, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
            raise RuntimeError(f"building the native core failed (cargo exit {proc.returncode}):\n"
                               + "\n".join(errors or proc.stderr.splitlines()[-30:]))
        library = next((target / "release" / f"lib{MODULE}{suffix}" for suffix in (".so", ".dylib")
                        if (target / "release" / f"lib{MODULE}{suffix}").is_file()), None)
        if library is None:
            raise RuntimeError(f"cargo built no lib{MODULE} in {target / 'release'}")
        work = Path(tempfile.mkdtemp(prefix="build-", dir=final.parent))
        try:
            shutil.copy2(library, work / f"{MODULE}.so")
            publish(work, final, _MARKER, source_hash())
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    # builds other checkouts made may still be in use: keep a few
    prune(final.parent, keep=final, versions=8, marker=_MARKER)
    return final


def without(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with every directory holding a built native core taken off PYTHONPATH (a
    subprocess then runs the Python core)."""
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and not (Path(p) / f"{MODULE}.so").is_file()]
    out = dict(environ)
    if parts:
        out["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        out.pop("PYTHONPATH", None)
    return out


def use(path: Path) -> None:
    """Make this process able to import the native core from `path`."""
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def main() -> int:
    if sys.argv[1:] == ["--target-dir"]:
        print(target_dir())
        return 0
    try:
        path = build(log=lambda m: print(m, file=sys.stderr))
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"kai-ray: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
