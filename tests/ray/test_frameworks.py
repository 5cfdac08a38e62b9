"""Framework adapters against the real packages, each in a fresh interpreter (import state and
env vars are per process). JAX runs on the CPU; PyTorch only where it is installed (its PyPI
wheel brings the CUDA libraries; see docs/gpu-env.md); CuPy is expected to be absent here."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POD = {"GPU_PORTION": "0.5", "KAI_RAY_GPU_MEMORY_MIB": "16384", "KAI_RAY_NVML": "off"}


def run(code: str, env: dict[str, str] | None = None) -> dict:
    """Run `code` in a clean interpreter; it prints one JSON object last."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("GPU_PORTION", "KAI_RAY_", "XLA_", "CUPY_", "CUDA_MPS_"))}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env["JAX_PLATFORMS"] = "cpu"
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


needs_jax = pytest.mark.skipif(not installed("jax"), reason="jax is not installed")


@needs_jax
def test_jax_env_is_set_before_import_and_read_by_jaxlib():
    out = run("""
        import json, os, sys
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        before = os.environ.get("XLA_CLIENT_MEM_FRACTION")
        assert "jax" not in sys.modules
        import jax
        from jaxlib import xla_client
        opts = xla_client.generate_pjrt_gpu_plugin_options()
        print(json.dumps({"before": before, "rec": r.frameworks["jax"],
                          "fraction": opts.get("memory_fraction"),
                          "old": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")}))
    """, POD)
    assert out["before"] == "0.4843"  # (0.5 × 16384 − 256) / 16384, rounded down
    assert out["fraction"] == pytest.approx(0.4843)
    assert out["old"] is None  # never both names: jaxlib refuses that combination
    assert out["rec"]["status"] == "applied"
    assert "before JAX was imported" in out["rec"]["detail"]


@needs_jax
def test_jax_after_backend_init_is_too_late_and_nothing_is_set():
    out = run("""
        import json, os
        import jax
        jax.numpy.zeros(2).block_until_ready()   # JAX creates its backends here
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        print(json.dumps({"rec": r.frameworks["jax"],
                          "env": os.environ.get("XLA_CLIENT_MEM_FRACTION")}))
    """, POD)
    assert out["rec"]["status"] == "too-late"
    assert "already created its backends" in out["rec"]["detail"]
    assert out["env"] is None


@needs_jax
def test_jax_imported_but_not_initialised_still_counts():
    out = run("""
        import json
        import jax
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        from jaxlib import xla_client
        print(json.dumps({"rec": r.frameworks["jax"],
              "fraction": xla_client.generate_pjrt_gpu_plugin_options().get("memory_fraction")}))
    """, POD)
    assert out["rec"]["status"] == "applied"
    assert "before JAX initialised its backend" in out["rec"]["detail"]
    assert out["fraction"] == pytest.approx(0.4843)


@needs_jax
def test_jax_user_value_kept_when_lower_and_lowered_when_higher():
    code = """
        import json, os
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        print(json.dumps({"rec": r.frameworks["jax"], "old": os.environ.get(
            "XLA_PYTHON_CLIENT_MEM_FRACTION"), "new": os.environ.get("XLA_CLIENT_MEM_FRACTION")}))
    """
    low = run(code, {**POD, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"})
    assert low["old"] == "0.2" and low["new"] is None and "kept" in low["rec"]["detail"]
    high = run(code, {**POD, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
    assert high["old"] == "0.4843" and high["new"] is None and "lowered" in high["rec"]["detail"]


@pytest.mark.skipif(installed("cupy"), reason="checks the message for an absent CuPy")
def test_cupy_absent_is_reported_gracefully():
    out = run("""
        import json, os
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        print(json.dumps({"rec": r.frameworks["cupy"], "env": os.environ.get(
            "CUPY_GPU_MEMORY_LIMIT")}))
    """, POD)
    assert out["rec"]["status"] == "not-installed"
    assert out["rec"]["detail"].startswith("CuPy is not installed: nothing to cap")
    assert out["env"] == str((8192 - 256) << 20)


def test_mps_limit_is_set_when_the_mps_pipe_exists(tmp_path):
    (tmp_path / "control").touch()
    code = """
        import json, os
        import kai_ray.ray as kr
        r = kr.cap_gpu_memory()
        print(json.dumps({"rec": r.frameworks["mps"],
                          "env": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")}))
    """
    on = run(code, {**POD, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    # the whole entitlement: MPS bounds everything the process holds, context included
    assert on["env"] == "0=8192M" and on["rec"]["status"] == "applied"
    off = run(code, {**POD, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")})
    assert off["env"] is None and off["rec"]["status"] == "skipped"
    forced_off = run(code, {**POD, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path),
                            "KAI_RAY_MPS_LIMIT": "off"})
    assert forced_off["env"] is None


def test_kai_ray_ray_imports_no_framework():
    out = run("""
        import json, sys
        import kai_ray.ray
        heavy = ("ray", "torch", "jax", "tensorflow", "cupy", "vllm", "pynvml", "numpy")
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
    """)
    assert out == []


@pytest.mark.skipif(not installed("torch"), reason="torch is not installed (see docs/gpu-env.md)")
def test_torch_import_triggers_the_adapter():
    out = run("""
        import json
        import kai_ray.ray as kr
        first = kr.cap_gpu_memory().frameworks["torch"]
        import torch   # the import hook applies the cap right after torch loads
        after = kr.current_cap().frameworks["torch"]
        print(json.dumps({"first": first, "after": after,
                          "cuda": torch.cuda.is_available(),
                          "queued": [getattr(c, "__name__", "") for c, _ in
                                     getattr(torch.cuda, "_queued_calls", [])]}))
    """, POD)
    assert out["first"]["status"] == "deferred"
    if out["cuda"]:
        assert out["after"]["status"] == "deferred"
        assert "_at_cuda_init" in out["queued"]  # runs inside torch's lazy CUDA init
    else:
        assert out["after"]["status"] == "no-gpu"
        assert "_at_cuda_init" not in out["queued"]  # nothing pretended without CUDA


@pytest.mark.skipif(not installed("tensorflow"), reason="tensorflow is not installed")
def test_tensorflow_import_triggers_the_adapter():
    out = run("""
        import json
        import kai_ray.ray as kr
        first = kr.cap_gpu_memory().frameworks["tensorflow"]
        import tensorflow as tf   # configured right after import, before it touches a GPU
        after = kr.current_cap().frameworks["tensorflow"]
        gpus = tf.config.list_physical_devices("GPU")
        limits = [c.memory_limit for g in gpus
                  for c in (tf.config.get_logical_device_configuration(g) or [])]
        print(json.dumps({"first": first, "after": after, "gpus": len(gpus), "limits": limits}))
    """, {**POD, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out["first"]["status"] == "deferred"
    if out["gpus"]:
        assert out["after"]["status"] == "applied"
        assert out["limits"] == [8192 - 256] * out["gpus"]  # MiB, the configured 16 GiB device
    else:
        assert out["after"]["status"] == "no-gpu"
