"""Container images built on this machine, cached by content, for a real kubelet node.

Nothing can be pulled from a container registry here, so every image is made locally from
Debian packages and wheels, with podman (runc, cgroupfs, no network inside the build), and
saved as a docker-archive tar that `ctr -n k8s.io images import` accepts:

    pause                registry.k8s.io/pause:3.10 (containerd's sandbox image): a static C binary
    busybox              Debian's busybox-static with its applet links (sh, wget, nslookup, ...)
    debian-python        Debian bookworm minbase + python3, pip, wget (mmdebstrap, podman import)
    kai-ray-reservation  the GPU reservation pod: `python3 -m kai_ray.reservation`, user 65532
    kai-ray-ray          Ray (ray[default], pinned) + kai_ray, so Ray workers `import kai_ray.ray`
    kai-ray              the scheduler/webhook image the chart runs (operator/Dockerfile): kai-ray
                         with the Rust core built in, on debian-python

Each archive lives in $KAI_RAY_CACHE/images/<name>/<key>/ (default ~/.cache/kai-ray), where
the key hashes everything that decides its bytes: the Dockerfile, the files put in the build
context, the base image's key and the pinned package versions. A second `ensure` builds nothing.

    python3 -m kai_ray.testing.images build pause busybox [--print-path]
    python3 -m kai_ray.testing.images list

The host packages come from tools/cluster/install-image-deps.sh (podman, runc, mmdebstrap,
busybox-static, gcc, libc6-dev). docs/images.md has the sizes and build times.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kai_ray
from kai_ray.testing.build_cache import prune, publish

REPO = Path(kai_ray.__file__).resolve().parent.parent
OPERATOR = REPO / "operator"
PAUSE_REF = "registry.k8s.io/pause:3.10"
BUSYBOX = Path("/bin/busybox")  # from busybox-static
# The Ray image's pins: the Ray the tests run on the host (pyproject's `test` extra) and the
# NVML bindings kai_ray.reservation and kai_ray.ray use.
RAY_VERSION = "2.60.0"
NVML_VERSION = "13.615.71"
# The toolchain of the kai-ray image's wheel, built on the host: the build refuses others, so
# the image's compiled code does not change with whatever the host has.
RUST_VERSION = "1.95.0"
DEBIAN_SUITE = "bookworm"
# The suite alone, without -updates and -security: it changes only at point releases, so the
# point release (12.x) the host's package lists name pins the rootfs (checked after the build).
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_RELEASE_FILE = Path(
    f"/var/lib/apt/lists/deb.debian.org_debian_dists_{DEBIAN_SUITE}_InRelease")
# wget: KubeRay's probes call it; ca-certificates: pip and Ray's HTTPS clients
DEBIAN_PACKAGES = ("python3", "python3-pip", "wget", "ca-certificates")
# podman's own flags: crun (its default) cannot run on a hybrid cgroup layout, and there is no
# systemd (nor journald) here
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file")
# podman refuses ulimits above the current ones, and its defaults are above them here; the
# builds install from wheels in the context, so they need no network; the archives are the
# cache, podman's layer cache would only hold copies
BUILD_FLAGS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
               "--network=none", "--pull=never", "--layers=false")
_MARKER = ".built"
Log = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """A tool is missing or a build step failed; the message has the step and its output."""


@dataclasses.dataclass(frozen=True)
class ImageArchive:
    """A built image: its tag, and the docker-archive tar holding it (tagged `ref`)."""

    name: str
    ref: str
    path: Path
    key: str
    built: bool  # whether this call built it (False: taken from the cache)
    build_seconds: float  # how long building it took, when it was built
    size: int  # bytes of the archive (the image, uncompressed)


@dataclasses.dataclass(frozen=True)
class _Spec:
    name: str
    base: str | None  # another image this one is built FROM (its key is part of this key)
    ref: Callable[[str], str]  # the tag, from the key
    inputs: Callable[[], list[tuple[str, bytes]]]  # what decides the bytes (cheap to compute)
    make: Callable[[Path, str, Log], None]  # builds `ref` into podman's storage, in a work dir


def cache_root() -> Path:
    """$KAI_RAY_IMAGE_CACHE, else images/ in $KAI_RAY_CACHE (default ~/.cache/kai-ray)."""
    if os.environ.get("KAI_RAY_IMAGE_CACHE"):
        return Path(os.environ["KAI_RAY_IMAGE_CACHE"])
    return Path(os.environ.get("KAI_RAY_CACHE", Path.home() / ".cache" / "kai-ray")) / "images"


# ---------------------------------------------------------------------------- running tools
def _run(cmd: list[str], step: str, log: Log, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> str:
    """Runs `cmd`, saying every 30 s that it still runs; returns its stdout. On failure raises
    ImageBuildError with the end of its output."""
    if shutil.which(cmd[0]) is None:
        raise ImageBuildError(f"{step}: {cmd[0]} not found "
                              "(run tools/cluster/install-image-deps.sh)")
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                log(f"   ... still {step} ({time.monotonic() - start:.0f} s)")
        out.seek(0)
        err.seek(0)
        stdout = out.read()
        if proc.returncode != 0:
            tail = "\n".join((stdout + err.read()).splitlines()[-25:])
            raise ImageBuildError(f"{step} failed (exit {proc.returncode}): "
                                  f"{' '.join(cmd)}\n{tail}")
    return stdout


def _podman(*args: str) -> list[str]:
    return [*PODMAN, *args]


def _version(*cmd: str) -> bytes:
    """A tool's or package's version, for a cache key ('' when absent: then the build fails)."""
    try:
        return subprocess.run(cmd, capture_output=True, check=False).stdout
    except FileNotFoundError:
        return b""


def _deb(package: str) -> bytes:
    return _version("dpkg-query", "-W", "-f", "${Version}", package)


def _file(path: Path) -> tuple[str, bytes]:
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path), path.read_bytes()


def _podman_build(dockerfile: Path, context: Path, ref: str, log: Log,
                  base: str | None = None) -> None:
    args = ["build", *BUILD_FLAGS, "-f", str(dockerfile), "-t", ref]
    if base:
        args += ["--build-arg", f"BASE_IMAGE={base}"]
    _run(_podman(*args, str(context)), f"podman build {ref}", log)


# ---------------------------------------------------------------------------- pause, busybox
def _pause_inputs() -> list[tuple[str, bytes]]:
    return [_file(OPERATOR / "pause.Dockerfile"), _file(OPERATOR / "pause" / "pause.c"),
            ("gcc", _version("gcc", "--version")), ("libc6-dev", _deb("libc6-dev"))]


def _make_pause(work: Path, ref: str, log: Log) -> None:
    log("   gcc -static pause.c")
    _run(["gcc", "-static", "-Os", "-s", "-o", str(work / "pause"),
          str(OPERATOR / "pause" / "pause.c")], "gcc -static pause.c", log)
    _podman_build(OPERATOR / "pause.Dockerfile", work, ref, log)


def _busybox_version() -> str:
    """Debian's busybox-static version as a tag: 1:1.35.0-4+deb12u1+b1 -> 1.35.0-4-deb12u1-b1."""
    version = _deb("busybox-static").decode().split(":")[-1]
    return version.replace("+", "-").replace("~", "-") or "missing"


def _busybox_inputs() -> list[tuple[str, bytes]]:
    return [_file(OPERATOR / "busybox.Dockerfile"),
            ("busybox", BUSYBOX.read_bytes() if BUSYBOX.is_file() else b"")]


def _make_busybox(work: Path, ref: str, log: Log) -> None:
    # Debian's dynamic `busybox` installs the same path: only busybox-static runs FROM scratch
    if _deb("busybox-static") == b"":
        raise ImageBuildError("busybox-static is not installed "
                              "(run tools/cluster/install-image-deps.sh)")
    shutil.copy2(BUSYBOX, work / "busybox")
    _podman_build(OPERATOR / "busybox.Dockerfile", work, ref, log)


# ---------------------------------------------------------------------------- debian-python
def _mmdebstrap_args(out: Path) -> list[str]:
    return [
        "mmdebstrap", "--variant=minbase", "--include=" + ",".join(DEBIAN_PACKAGES),
        '--aptopt=APT::Install-Recommends "false"',
        # /usr merged by the hook, not by the usrmerge package (which pulls in 46 MB of perl)
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        # documentation and translations are of no use in a container: ~40 MB less
        "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-exclude=/usr/share/info/*",
        DEBIAN_SUITE, str(out), DEBIAN_MIRROR,
    ]


def _debian_release() -> str:
    """The point release of the suite, as the host's package lists last saw it ('12.15'); ''
    when they do not have it (apt-get update fetches it)."""
    if DEBIAN_RELEASE_FILE.is_file():
        for line in DEBIAN_RELEASE_FILE.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return ""


def _debian_inputs() -> list[tuple[str, bytes]]:
    # Debian's snapshot archive is out of reach here: the suite is pinned by its point release
    return [("mmdebstrap", " ".join(_mmdebstrap_args(Path("out.tar"))).encode()),
            ("mmdebstrap-version", _deb("mmdebstrap")),
            ("release", _debian_release().encode())]


def _make_debian(work: Path, ref: str, log: Log) -> None:
    rootfs = work / "rootfs.tar"
    release = _debian_release()
    log(f"   mmdebstrap {DEBIAN_SUITE} {release} minbase + {', '.join(DEBIAN_PACKAGES)} "
        "(1-2 min)")
    _run(_mmdebstrap_args(rootfs), "mmdebstrap", log)
    built = _run(["tar", "-xOf", str(rootfs), "./etc/debian_version"], "read debian_version",
                 log).strip()
    if release and built != release:
        # the key said `release` but the mirror served another one: the key would lie
        raise ImageBuildError(f"the mirror served Debian {built}, the host's package lists name "
                              f"{release}: run `apt-get update`, then build again")
    changes = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8",
               'CMD ["python3"]']
    _run(_podman("import", *[f"--change={c}" for c in changes], str(rootfs), ref),
         "podman import", log)
    (work / "packages.txt").write_text(
        _run(["tar", "-xOf", str(rootfs), "./var/lib/dpkg/status"], "read dpkg status", log))


# ---------------------------------------------------------------------------- Python images
def _kai_ray_files(parts: tuple[str, ...]) -> list[Path]:
    """The files of kai_ray's slice `parts` (paths under kai_ray/: a module or a subpackage),
    without caches or compiled modules. An image holds only the slice it runs, so an edit to
    the scheduler does not rebuild it."""
    package = REPO / "kai_ray"
    return sorted(p for p in package.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".so", ".c")
                  and any(p.relative_to(package).as_posix().startswith(part) for part in parts))


def _kai_ray_wheel(dest: Path, parts: tuple[str, ...], log: Log) -> None:
    """Builds a pure-Python kai_ray wheel of the slice `parts` into `dest`, from a copy of the
    sources (pip would otherwise write build/ and *.egg-info into the checkout)."""
    with tempfile.TemporaryDirectory(prefix="kai-ray-src-") as tmp:
        src = Path(tmp)
        for path in [REPO / "pyproject.toml", REPO / "setup.py", *_kai_ray_files(parts)]:
            target = src / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        # the README is only the wheel's long description: a stub keeps README edits from
        # changing the images
        (src / "README.md").write_text("kai-ray\n")
        env = {k: v for k, v in os.environ.items()
               if k != "KAI_RAY_NATIVE"}
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(dest), str(src)], "pip wheel kai_ray", log, env=env)


HELPER_PROJECT = REPO / "packaging" / "ray-helper"
HELPER_PARTS = ("__init__.py", "py.typed", "ray/")


def helper_wheel(dest: Path, log: Log) -> Path:
    """Builds the kai-ray-helper distribution (kai_ray.ray alone, no dependencies:
    packaging/ray-helper/pyproject.toml) into `dest`; returns the wheel's path."""
    with tempfile.TemporaryDirectory(prefix="kai-ray-helper-") as tmp:
        src = Path(tmp)
        shutil.copy2(HELPER_PROJECT / "pyproject.toml", src / "pyproject.toml")
        for path in _kai_ray_files(HELPER_PARTS):
            target = src / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        before = set(dest.glob("kai_ray_helper-*.whl")) if dest.is_dir() else set()
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(dest), str(src)], "pip wheel kai-ray-helper", log)
    built = sorted(set(dest.glob("kai_ray_helper-*.whl")) - before) or sorted(
        dest.glob("kai_ray_helper-*.whl"))
    return built[-1]


def _wheel_target() -> list[str]:
    """pip's flags for wheels that run on the image's Python (Debian bookworm's CPython 3.11,
    glibc 2.36), whatever Python runs this."""
    machine = os.uname().machine
    return ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
            "--abi", "cp311", "--abi", "abi3", "--abi", "none",
            # pip does not widen a manylinux_2_36 platform to the older glibc tags it includes
            *(f"--platform=manylinux_2_{minor}_{machine}" for minor in range(17, 37)),
            f"--platform=manylinux2014_{machine}"]  # which pip widens to 2010 and 1


def _wheels(requirements: list[str], log: Log) -> Path:
    """The wheels of `requirements` and all their dependencies for the image's Python,
    downloaded on the host (pip in a build cannot verify PyPI's certificate here) and cached by
    the requirement list."""
    target = _wheel_target()
    key = hashlib.sha256("\n".join([*target, *requirements]).encode()).hexdigest()[:16]
    final = cache_root() / "wheels" / key
    if (final / _MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheels-", dir=final.parent))
    try:
        log(f"   pip download {' '.join(requirements)}")
        _run([sys.executable, "-m", "pip", "download", "-q", *target, "-d", str(work),
              *requirements], "pip download", log)
        (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
        publish(work, final, _MARKER, key)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    prune(final.parent, keep=final, versions=4, marker=_MARKER)  # Ray's are ~0.1 GB
    return final


def _python_image(dockerfile: str, requirements: list[str], parts: tuple[str, ...],
                  helper: bool = False) -> tuple[
        Callable[[], list[tuple[str, bytes]]], Callable[[Path, str, Log], None]]:
    """Inputs and builder of an image FROM debian-python that installs `requirements` and the
    slice `parts` of kai_ray offline, from the context's wheels/ directory."""

    def inputs() -> list[tuple[str, bytes]]:
        project = ([HELPER_PROJECT / "pyproject.toml"] if helper
                   else [REPO / "pyproject.toml", REPO / "setup.py"])
        sources = [*project, *_kai_ray_files(parts)]
        wheels = [*_wheel_target(), *requirements]
        return [_file(OPERATOR / dockerfile), ("wheels", "\n".join(wheels).encode()),
                *(_file(p) for p in sources)]

    def make(work: Path, ref: str, log: Log) -> None:
        wheels = work / "wheels"
        shutil.copytree(_wheels(requirements, log), wheels, copy_function=os.link,
                        ignore=shutil.ignore_patterns(_MARKER))
        if helper:
            helper_wheel(wheels, log)
        else:
            _kai_ray_wheel(wheels, parts, log)
        base = ensure("debian-python", log=log)
        _load(base, log)
        log(f"   podman build FROM {base.ref}")
        _podman_build(OPERATOR / dockerfile, work, ref, log, base=base.ref)

    return inputs, make


def _image_id(ref: str) -> str:
    """The id of the image podman's storage holds under `ref` ('' if none)."""
    out = subprocess.run(_podman("image", "inspect", "--format", "{{.Id}}", ref),
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def _load(image: ImageArchive, log: Log) -> None:
    """Puts `image` into podman's storage (a build FROM it needs it there) unless it is."""
    exists = subprocess.run(_podman("image", "exists", image.ref), capture_output=True)
    if exists.returncode != 0:
        log(f"   podman load {image.ref}")
        _run(_podman("load", "-q", "-i", str(image.path)), f"podman load {image.ref}", log)


# ---------------------------------------------------------------------------- kai-ray
def _toolchain(cmd: list[str], want: str, what: str) -> bytes:
    """The output of `cmd --version`, which must name version `want`."""
    out = _version(*cmd).decode()
    if want not in out.split():
        raise ImageBuildError(f"the kai-ray image is built with {what} {want}; "
                              f"`{' '.join(cmd)}` says {out.strip() or 'nothing (not found)'}")
    return out.encode()


def _operator_requirements() -> list[str]:
    """kai-ray's dependencies, each pinned to the version this environment runs (the tests ran
    against those)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    pins = []
    for line in metadata.requires("kai-ray") or []:
        req = Requirement(line)
        if req.marker is None:  # extras (ray, test, ...) carry a marker
            pins.append(f"{req.name}=={metadata.version(req.name)}")
    return sorted(pins)


def _operator_sources() -> list[Path]:
    native = REPO / "native"
    rust = sorted(p for p in native.rglob("*") if p.is_file() and "target" not in
                  p.relative_to(native).parts and p.suffix in (".rs", ".toml", ".lock"))
    return [REPO / "pyproject.toml", REPO / "setup.py", *_kai_ray_files(("",)), *rust]


def _operator_inputs() -> list[tuple[str, bytes]]:
    return [_file(OPERATOR / "Dockerfile"), _file(OPERATOR / "entrypoint.sh"),
            ("requirements", "\n".join([*_wheel_target(), *_operator_requirements()]).encode()),
            ("toolchains", f"rust {RUST_VERSION}".encode()),
            ("gcc", _version("gcc", "--version")),
            *(_file(p) for p in _operator_sources())]


def _operator_wheel(dest: Path, log: Log) -> None:
    """kai-ray's wheel with the Rust core, from a copy of the sources; cargo's target directory
    is cached so a rebuild compiles only what changed."""
    _toolchain(["rustc", "--version"], RUST_VERSION, "Rust")
    with tempfile.TemporaryDirectory(prefix="kai-ray-src-") as tmp:
        src = Path(tmp)
        for path in _operator_sources():
            target = src / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (src / "README.md").write_text("kai-ray\n")
        target_dir = cache_root() / "cargo-target"
        env = {**os.environ, "KAI_RAY_NATIVE": "1", "CARGO_TARGET_DIR": str(target_dir)}
        log("   pip wheel kai-ray (with the Rust core; about a minute)")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(dest), str(src)], "pip wheel kai-ray (with the Rust core)", log, env=env)


def _make_operator(work: Path, ref: str, log: Log) -> None:
    wheels = work / "wheels"
    requirements = _operator_requirements()
    shutil.copytree(_wheels(requirements, log), wheels, copy_function=os.link,
                    ignore=shutil.ignore_patterns(_MARKER))
    _operator_wheel(wheels, log)
    (wheels / "requirements.txt").write_text("\n".join([*requirements, "kai-ray"]) + "\n")
    shutil.copy2(OPERATOR / "entrypoint.sh", work / "entrypoint.sh")
    base = ensure("debian-python", log=log)
    _load(base, log)
    log(f"   podman build FROM {base.ref}")
    _podman_build(OPERATOR / "Dockerfile", work, ref, log, base=base.ref)


_reservation = _python_image("reservation.Dockerfile", [f"nvidia-ml-py=={NVML_VERSION}"],
                             ("__init__.py", "py.typed", "reservation.py"))
_ray = _python_image("ray.Dockerfile",
                     [f"ray[default]=={RAY_VERSION}", f"nvidia-ml-py=={NVML_VERSION}"],
                     HELPER_PARTS, helper=True)

SPECS: dict[str, _Spec] = {s.name: s for s in [
    _Spec("pause", None, lambda key: PAUSE_REF, _pause_inputs, _make_pause),
    _Spec("busybox", None, lambda key: f"kai-ray.local/busybox:{_busybox_version()}",
          _busybox_inputs, _make_busybox),
    _Spec("debian-python", None, lambda key: f"kai-ray.local/debian-python:{DEBIAN_SUITE}-{key}",
          _debian_inputs, _make_debian),
    _Spec("kai-ray-reservation", "debian-python",
          lambda key: f"kai-ray.local/kai-ray-reservation:{kai_ray.__version__}-{key}",
          *_reservation),
    _Spec("kai-ray-ray", "debian-python",
          lambda key: f"kai-ray.local/ray:{RAY_VERSION}-{key}", *_ray),
    _Spec("kai-ray", "debian-python",
          lambda key: f"kai-ray.local/kai-ray:{kai_ray.__version__}-{key}",
          _operator_inputs, _make_operator),
]}
NAMES = tuple(SPECS)


# ---------------------------------------------------------------------------- the cache
def key(name: str) -> str:
    """The content key of image `name` (12 hex digits)."""
    spec = _spec(name)
    digest = hashlib.sha256(name.encode())
    digest.update(" ".join([*PODMAN, *BUILD_FLAGS]).encode() + _deb("podman"))
    if spec.base:
        digest.update(b"base:" + key(spec.base).encode())
    for label, data in spec.inputs():
        digest.update(f"\0{label}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:12]


def _spec(name: str) -> _Spec:
    if name not in SPECS:
        raise KeyError(f"no image {name!r}; known: {', '.join(NAMES)}")
    return SPECS[name]


def _cached(name: str, image_key: str) -> ImageArchive | None:
    final = cache_root() / name / image_key
    if not (final / _MARKER).is_file():
        return None
    meta = json.loads((final / "image.json").read_text())
    return ImageArchive(name, meta["ref"], final / "image.tar", image_key, False,
                        meta["build_seconds"], meta["size"])


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One build of an image at a time, across processes (the node and the tests both ask)."""
    path = cache_root() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure(name: str, log: Log = _stderr) -> ImageArchive:
    """The archive of image `name`, built (with its base image) if this content has not been
    built yet. Raises ImageBuildError when a tool is missing or a step fails."""
    spec = _spec(name)
    image_key = key(name)
    hit = _cached(name, image_key)
    if hit:
        return hit
    with _locked(name):
        hit = _cached(name, image_key)  # another process may have built it meanwhile
        if hit:
            return hit
        ref = spec.ref(image_key)
        final = cache_root() / name / image_key
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=final.parent))
        start = time.monotonic()

        def timed(message: str) -> None:  # each step says when it starts
            log(f"{message}  [{time.monotonic() - start:.1f} s]")

        log(f"== building image {name} ({ref})")
        replaced = _image_id(ref)  # a fixed tag's former image, left untagged by the build
        try:
            spec.make(work, ref, timed)
            timed(f"   podman save {ref}")
            _run(_podman("save", "-q", "--format", "docker-archive", "-o",
                         str(work / "image.tar"), ref), "podman save", timed)
            seconds = round(time.monotonic() - start, 1)
            size = (work / "image.tar").stat().st_size
            (work / "image.json").write_text(json.dumps(
                {"name": name, "ref": ref, "key": image_key, "build_seconds": seconds,
                 "size": size, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                indent=1) + "\n")
            for scratch in work.iterdir():  # keep the archive, its metadata and package lists
                if scratch.name not in ("image.tar", "image.json", "packages.txt"):
                    (shutil.rmtree if scratch.is_dir() else os.remove)(scratch)
            publish(work, final, _MARKER, image_key)
            if replaced and replaced != _image_id(ref):
                # by id: podman refuses while it has another tag or a container uses it
                subprocess.run(_podman("rmi", replaced), capture_output=True, check=False)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
        _prune(final, ref)
        log(f"   built {name} in {seconds:.1f} s ({size / 1e6:.1f} MB)")
    return ImageArchive(name, ref, final / "image.tar", image_key, True, seconds, size)


def _prune(final: Path, ref: str) -> None:
    """Drops all but the last two builds of an image (a Ray archive is half a GB), and the
    dropped ones from podman's storage."""
    older = {d: json.loads((d / "image.json").read_text())["ref"] for d in final.parent.iterdir()
             if d != final and (d / _MARKER).is_file() and (d / "image.json").is_file()}
    prune(final.parent, keep=final, versions=2, marker=_MARKER)
    gone = sorted({r for d, r in older.items() if not d.exists() and r != ref})
    if gone:
        subprocess.run(_podman("rmi", "--ignore", *gone), capture_output=True, check=False)


def archive_tags(path: Path) -> list[str]:
    """The tags a docker-archive tar holds (its manifest.json's RepoTags)."""
    out = subprocess.run(["tar", "-xOf", str(path), "manifest.json"], capture_output=True,
                         check=True)
    return [tag for entry in json.loads(out.stdout) for tag in entry.get("RepoTags") or []]


def import_into_containerd(archive: ImageArchive | Path, ctr_binary: str | Path = "ctr",
                           address: str | Path = "/run/containerd/containerd.sock",
                           namespace: str = "k8s.io", timeout: float = 300) -> None:
    """`ctr images import` of the archive into containerd's CRI namespace, where the kubelet
    finds it (pods then use `imagePullPolicy: Never` or IfNotPresent with the exact tag)."""
    path = archive.path if isinstance(archive, ImageArchive) else archive
    cmd = [str(ctr_binary), "--address", str(address), "-n", namespace, "images", "import",
           str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"{' '.join(cmd)} failed (exit {proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()}")


# ---------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.images",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or take from the cache) the named images")
    build.add_argument("names", nargs="+", metavar="NAME", choices=[*NAMES, "all"])
    build.add_argument("--print-path", action="store_true",
                       help="print only each archive's path, one a line")
    sub.add_parser("list", help="the images, their tags and whether this content is cached")
    hw = sub.add_parser("helper-wheel", help="build the kai-ray-helper wheel (kai_ray.ray alone, "
                        "no dependencies) for a Ray image")
    hw.add_argument("-o", "--out", type=Path, default=Path("dist"),
                    help="directory (default dist/)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name in NAMES:
            hit = _cached(name, key(name))
            state = (f"cached {hit.size / 1e6:7.1f} MB, built in {hit.build_seconds:5.1f} s  "
                     f"{hit.path}" if hit else "not built")
            print(f"{name:20} {_spec(name).ref(key(name)):55} {state}")
        return 0
    if args.command == "helper-wheel":
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            print(helper_wheel(args.out.resolve(), _stderr))
        except ImageBuildError as exc:
            print(f"kai-ray: {exc}", file=sys.stderr)
            return 1
        return 0
    names = list(NAMES) if "all" in args.names else args.names
    for name in names:
        start = time.monotonic()
        try:
            image = ensure(name)
        except ImageBuildError as exc:
            print(f"kai-ray: image {name}: {exc}", file=sys.stderr)
            return 1
        if args.print_path:
            print(image.path)
        else:
            took = time.monotonic() - start
            how = "built" if image.built else "cached"
            print(f"{name:20} {how:6} {took:6.1f} s  {image.size / 1e6:7.1f} MB  {image.ref}  "
                  f"{image.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
