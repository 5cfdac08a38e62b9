"""On a real NVIDIA GPU: JAX and CuPy allocations past the helper's cap fail, within it succeed
(PyTorch: test_gpu_torch.py). Each probe runs in a fresh process with GPU_PORTION=0.5, the env a
half-GPU pod gets; the cap is applied before the framework is imported, as in a Ray worker."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

JAX_PROBE = """
    import json
    import kai_ray.ray as kr
    kr.cap_gpu_memory()
    import jax, jax.numpy as jnp
    try:
        dev = jax.devices("gpu")[0]
    except RuntimeError:
        print(json.dumps({"cuda": False}))
        raise SystemExit(0)
    rec = kr.current_cap().frameworks["jax"]
    limit = int(dev.memory_stats()["bytes_limit"])
    x = jnp.zeros(int(limit * 0.8), dtype=jnp.uint8).block_until_ready()
    del x
    try:
        y = jnp.zeros(int(limit * 1.1), dtype=jnp.uint8).block_until_ready()
        beyond = True
    except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
        beyond = "RESOURCE_EXHAUSTED" not in str(e) and str(e)
    print(json.dumps({"cuda": True, "rec": rec, "limit": limit, "beyond": beyond}))
"""

CUPY_PROBE = """
    import json
    import kai_ray.ray as kr
    kr.cap_gpu_memory()
    import cupy
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        print(json.dumps({"cuda": False}))
        raise SystemExit(0)
    rec = kr.current_cap().frameworks["cupy"]
    limit = int(cupy.get_default_memory_pool().get_limit())
    x = cupy.empty(int(limit * 0.8), dtype=cupy.uint8)
    del x
    try:
        y = cupy.empty(int(limit * 1.1), dtype=cupy.uint8)
        beyond = True
    except cupy.cuda.memory.OutOfMemoryError:
        beyond = False
    print(json.dumps({"cuda": True, "rec": rec, "limit": limit, "beyond": beyond}))
"""


def _total_bytes() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    finally:
        pynvml.nvmlShutdown()


def _probe(code: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_PORTION", "KAI_RAY_", "XLA_", "CUPY_"))}
    env.update({"GPU_PORTION": "0.5",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["cuda"]:
        pytest.skip("no CUDA device")
    return out


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_allocation_past_the_cap_fails_and_within_succeeds():
    out = _probe(JAX_PROBE)
    assert out["rec"]["status"] == "applied", out["rec"]
    # XLA's allocator gets the fraction the helper set: at most half the device
    assert 0.3 * _total_bytes() < out["limit"] <= 0.5 * _total_bytes()
    assert out["beyond"] is False, out["beyond"]


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="cupy is not installed")
def test_cupy_allocation_past_the_cap_fails_and_within_succeeds():
    out = _probe(CUPY_PROBE)
    assert out["rec"]["status"] == "applied", out["rec"]
    # half the device minus the CUDA-context headroom
    assert 0.45 * _total_bytes() < out["limit"] <= _total_bytes() // 2, out
    assert out["beyond"] is False
