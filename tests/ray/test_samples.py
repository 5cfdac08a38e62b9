"""The notebook-style samples in ray_samples/ run as scripts (each starts its own local Ray)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def run_sample(name: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PORTION", "KAI_RAY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(ROOT / "ray_samples" / name)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_notebook_sample_shows_the_three_ways():
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("needs ray and jax")
    out = run_sample("gpu_caps_notebook.py")
    # way 1 (runtime_env): a num_gpus=0.5 task in a 0.5 pod: 4096 MiB − 256 MiB headroom
    assert "3840 MiB of 16384 MiB" in out
    assert "jax: applied: set XLA_CLIENT_MEM_FRACTION=0.2343 before JAX was imported" in out
    # way 2 (decorator): num_gpus=0.25 → 2048 − 256 MiB; vLLM gets the entitlement
    assert f"actor cap bytes: {(2048 - 256) << 20}" in out
    assert "'gpu_memory_utilization': 0.125" in out
    # way 3 (function in a task): num_gpus=1 → the pod's whole half
    assert f"'cap_bytes': {(8192 - 256) << 20}" in out
    assert "Ray driver" in out


def test_serve_sample_runs():
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("needs ray[serve]")
    out = run_sample("gpu_caps_serve.py")
    assert f"'cap_bytes': {(4096 - 256) << 20}" in out
    assert "'gpu_memory_utilization': 0.25" in out
