"""The wheel the image is built from (`KAI_RAY_NATIVE=1 pip wheel --no-build-isolation .`, as
operator/Dockerfile runs it) ships the Rust core, and kai_ray installed from it runs that core
and takes the Python core's decisions. Built from a copy of the sources (pip's build/ stays out
of the checkout), with cargo's target directory shared with kai_ray.testing.native_core."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from kai_ray.testing import native_core

ROOT = Path(__file__).resolve().parent.parent

_CHECK = """
import json
from kai_ray.core.schedule import describe_core, schedule
from kai_ray.sim.synthetic import cluster
import kai_ray, kai_ray_native
snapshot = cluster(120, seed=4)
native, python = schedule(snapshot, core="native"), schedule(snapshot, core="python")
print(json.dumps({"core": describe_core(), "module": kai_ray_native.__file__,
                  "package": kai_ray.__file__, "binds": len(native.binds),
                  "same": native == python}))
"""


def test_the_wheel_ships_the_native_core(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "kai_ray", src / "kai_ray",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # copied with new modification times: cargo's target directory here is the wheel test's
    # own, and cargo takes a crate whose files are older than its last build for built
    shutil.copytree(ROOT / "native", src / "native", ignore=shutil.ignore_patterns("target"),
                    copy_function=shutil.copy)
    env = {**os.environ, "KAI_RAY_NATIVE": "1",
           "CARGO_TARGET_DIR": str(native_core.cache_root() / "native-targets" / "wheel-test")}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                           "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("kai_ray-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("kai_ray_native.") and n.endswith(".so") for n in names), names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # only the wheel's kai_ray and module: none from the checkout or the test run's PYTHONPATH
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-P", "-c", _CHECK], cwd=tmp_path,
                          env={**clean, "PYTHONPATH": str(site)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert found["module"].startswith(str(site)) and found["package"].startswith(str(site))
    assert found["core"].startswith("native (Rust)")
    assert found["binds"] > 0 and found["same"] is True
