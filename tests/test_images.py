"""The container images of kai_ray.testing.images: each builds, a second `ensure` is a cache
hit, the archive carries the expected tag, and the images do their job when run (podman with
runc). The key tests need no tools; the others (marker `images`) need podman, mmdebstrap and
busybox-static (tools/cluster/install-image-deps.sh) and build everything once (cold: about
1.5 min on 2 cores)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kai_ray.testing import images

TOOLS = ("podman", "mmdebstrap", "gcc", "busybox")
needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS),
    reason="needs " + ", ".join(TOOLS) + " (tools/cluster/install-image-deps.sh)")
RUN_FLAGS = ("--rm", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*images.PODMAN, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def run(image: images.ImageArchive, command: list[str], *flags: str) -> str:
    """The output of a throwaway container of `image` (loaded into podman's storage first)."""
    images._load(image, log=print)
    proc = podman("run", *RUN_FLAGS, *flags, image.ref, *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# ---------------------------------------------------------------------------- keys
def test_the_key_follows_the_installed_sources(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    before = {name: images.key(name) for name in images.NAMES}
    assert len(set(before.values())) == len(before)
    extra = tmp_path / "reservation.py"
    extra.write_text("# changed\n")
    files = images._kai_ray_files
    monkeypatch.setattr(images, "_kai_ray_files",
                        lambda parts: [*files(parts), extra] if "reservation.py" in parts
                        else files(parts))
    assert images.key("kai-ray-reservation") != before["kai-ray-reservation"]
    assert images.key("kai-ray-ray") == before["kai-ray-ray"]  # it holds no reservation.py
    assert images.key("pause") == before["pause"]


def test_a_new_base_changes_the_images_built_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {name: images.key(name) for name in images.NAMES}
    monkeypatch.setattr(images, "_debian_release", lambda: "12.99")
    for name in ("debian-python", "kai-ray-reservation", "kai-ray-ray", "kai-ray"):
        assert images.key(name) != before[name], name
    assert images.key("busybox") == before["busybox"]


def test_the_scheduler_image_follows_every_source_the_others_only_theirs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = {name: images.key(name) for name in images.NAMES}
    edited = tmp_path / "scheduler_loop.py"
    edited.write_text("# changed\n")
    files = images._kai_ray_files
    monkeypatch.setattr(images, "_kai_ray_files",
                        lambda parts: [*files(parts), edited] if "" in parts else files(parts))
    assert images.key("kai-ray") != before["kai-ray"]
    for name in ("kai-ray-ray", "kai-ray-reservation"):
        assert images.key(name) == before[name], name


def test_the_scheduler_image_refuses_another_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "RUST_VERSION", "0.0.1")
    with pytest.raises(images.ImageBuildError, match=r"Rust 0\.0\.1"):
        images._operator_wheel(Path("/nonexistent"), print)


def test_the_ray_helper_distribution_is_kai_ray_ray_alone(tmp_path: Path) -> None:
    import tomllib
    import zipfile

    import kai_ray

    project = tomllib.loads((images.HELPER_PROJECT / "pyproject.toml").read_text())["project"]
    assert project["version"] == kai_ray.__version__
    assert project["dependencies"] == []
    wheel = images.helper_wheel(tmp_path, print)
    names = zipfile.ZipFile(wheel).namelist()
    code = sorted(n for n in names if not n.startswith("kai_ray_helper-"))
    assert "kai_ray/ray/caps.py" in code and "kai_ray/__init__.py" in code
    assert all(n.startswith("kai_ray/ray/") or n in ("kai_ray/__init__.py", "kai_ray/py.typed")
               for n in code), code
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("METADATA"))).decode()
    # nothing of the scheduler's: only the optional NVML bindings
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist")]
    assert requires == ['Requires-Dist: nvidia-ml-py>=12; extra == "nvml"'], requires


def test_each_image_holds_only_its_slice_of_kai_ray() -> None:
    package = images.REPO / "kai_ray"
    ray = {p.relative_to(package).as_posix() for p in images._kai_ray_files(("ray/",))}
    assert "ray/__init__.py" in ray and all(p.startswith("ray/") for p in ray)
    assert not any("__pycache__" in p for p in ray)


# ---------------------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def built() -> dict[str, images.ImageArchive]:
    return {name: images.ensure(name, log=print) for name in images.NAMES}


@pytest.mark.images
@needs_tools
@pytest.mark.timeout(1800)
def test_every_image_builds_once_and_carries_its_tag(built: dict[str, images.ImageArchive]) -> None:
    for name, image in built.items():
        assert image.path.is_file() and image.size == image.path.stat().st_size, name
        assert images.archive_tags(image.path) == [image.ref], name
        start = time.monotonic()
        again = images.ensure(name, log=print)
        took = time.monotonic() - start
        assert not again.built and again.path == image.path and again.ref == image.ref, name
        assert took < 1.0, f"{name}: a cache hit took {took:.2f} s"
    assert built["pause"].ref == "registry.k8s.io/pause:3.10"


@pytest.mark.images
@needs_tools
def test_pause_stops_on_sigterm_and_reaps_orphans(built: dict[str, images.ImageArchive]) -> None:
    pause = built["pause"]
    images._load(pause, log=print)
    name = f"kai-ray-test-pause-{time.monotonic_ns()}"
    started = podman("run", "-d", *RUN_FLAGS[1:], "--name", name, pause.ref)
    assert started.returncode == 0, started.stderr
    try:
        # an orphan in the pod's PID namespace is re-parented to pause (PID 1), which must reap
        # it: a zombie would show as Z
        orphan = "sh -c 'sleep 0.2 &'; sleep 1; ps -o pid,stat,comm"
        out = run(built["busybox"], ["sh", "-c", orphan], "--pid", f"container:{name}")
        assert "pause" in out and not [line for line in out.splitlines()[1:]
                                       if line.split()[1].startswith("Z")], out
        start = time.monotonic()
        stopped = podman("stop", "-t", "20", name)
        took = time.monotonic() - start
        assert stopped.returncode == 0, stopped.stderr
        # a process that ignored SIGTERM would be killed after 20 s, with status 137
        code = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        assert code == "0" and took < 10, (code, took)
    finally:
        podman("rm", "-f", name)


@pytest.mark.images
@needs_tools
def test_busybox_serves_and_fetches(built: dict[str, images.ImageArchive]) -> None:
    out = run(built["busybox"], [
        "sh", "-c", "mkdir /w && echo hello > /w/index.html && httpd -p 8080 -h /w"
        " && wget -q -O - http://127.0.0.1:8080/ && which nslookup sleep env cat"],
        "--network", "none")
    assert out.split() == ["hello", "/bin/nslookup", "/bin/sleep", "/bin/env", "/bin/cat"]


@pytest.mark.images
@needs_tools
def test_the_reservation_image_runs_its_program_as_non_root(
        built: dict[str, images.ImageArchive]) -> None:
    image = built["kai-ray-reservation"]
    check = "import os, kai_ray.reservation, pynvml; print(os.getuid(), os.getgid())"
    out = run(image, ["-c", check], "--entrypoint", "python3")
    assert out.split() == ["65532", "65532"]
    config = podman("image", "inspect", image.ref, "--format", "{{json .Config.Entrypoint}}")
    assert config.stdout.strip() == '["python3","-m","kai_ray.reservation"]'
    # the entry point itself: --help exits 0 only when the program imports and parses
    assert "kai_ray.reservation" in run(image, ["--help"])


@pytest.mark.images
@needs_tools
def test_the_ray_image_runs_ray_and_kai_ray_ray(built: dict[str, images.ImageArchive]) -> None:
    image = built["kai-ray-ray"]
    # a real one-node Ray instance whose task imports kai_ray.ray, as a worker of a pod would
    script = """
import os, ray
ray.init(num_cpus=1, include_dashboard=False)
@ray.remote
def cap():
    import kai_ray.ray as kr
    return kr.current_cap().active
print(ray.__version__, os.getuid(), ray.get(cap.remote()))
"""
    out = run(image, ["python3", "-c", script], "--shm-size", "512m")
    assert out.split()[-3:] == [images.RAY_VERSION, "1000", "False"]
    # a head as KubeRay starts it (`bash -lc`, whose login PATH must still find `ray`), and
    # KubeRay's probes: wget on the dashboard agent's and the dashboard's health endpoints
    probes = ("wget -q -T 2 -O- http://127.0.0.1:52365/api/local_raylet_healthz"
              " && wget -q -T 2 -O- http://127.0.0.1:8265/api/gcs_healthz")
    head = ("ray start --head --num-cpus=1 >/tmp/start.log 2>&1 || cat /tmp/start.log; "
            f"for i in $(seq 60); do {probes} && exit 0; sleep 1; done; exit 1")
    assert run(image, ["bash", "-lc", head], "--shm-size", "512m") == "successsuccess"


@pytest.mark.images
@needs_tools
def test_the_scheduler_image_runs_the_native_core(
        built: dict[str, images.ImageArchive]) -> None:
    image = built["kai-ray"]
    check = ("import os, kai_ray_native, kai_ray.core.schedule as s; "
             "print(os.getuid(), s.__file__.endswith('.py'), s.describe_core().split()[0])")
    out = run(image, ["-c", check], "--entrypoint", "python3")
    # the Python core is the source as written (no compiled build), the Rust core the engine
    assert out.split() == ["65532", "True", "native"]
    # the entry point: `kai-ray demo` through it, on the Rust core
    assert "4 of 4 scenarios behaved as expected" in run(image, ["demo", "--core", "native"])


@pytest.mark.images
@needs_tools
@pytest.mark.skipif(shutil.which("containerd") is None or shutil.which("ctr") is None,
                    reason="needs containerd and ctr")
def test_archives_import_into_containerd(built: dict[str, images.ImageArchive],
                                         tmp_path: Path) -> None:
    sock = tmp_path / "containerd.sock"
    (tmp_path / "config.toml").write_text(
        f'version = 2\nroot = "{tmp_path}/root"\nstate = "{tmp_path}/state"\n'
        f'[grpc]\n  address = "{sock}"\n')
    with (tmp_path / "containerd.log").open("w") as log:
        proc = subprocess.Popen(["containerd", "--config", str(tmp_path / "config.toml")],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in ("pause", "busybox"):
            images.import_into_containerd(built[name], "ctr", sock)
        listed = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls",
                                 "-q"], capture_output=True, text=True, check=True).stdout
        assert {built["pause"].ref, built["busybox"].ref} <= set(listed.split())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
