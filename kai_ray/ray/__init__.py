"""Ray-side helper: GPU memory caps that match the pod's GPU fraction.

Stdlib only at import time; ray, torch, jax, tensorflow, cupy and pynvml are used only when
present. See docs/gpu-env.md for the environment contract and the README for the three ways in.
"""

from kai_ray.ray.gpu_env import GpuEnvError
from kai_ray.ray.process import (
    CapReport,
    GpuCapped,
    cap_gpu_memory,
    current_cap,
    describe,
    gpu_capped,
    runtime_env,
    vllm_engine_kwargs,
    vllm_gpu_memory_utilization,
    worker_setup_hook,
)

__all__ = [
    "CapReport",
    "GpuCapped",
    "GpuEnvError",
    "cap_gpu_memory",
    "current_cap",
    "describe",
    "gpu_capped",
    "runtime_env",
    "vllm_engine_kwargs",
    "vllm_gpu_memory_utilization",
    "worker_setup_hook",
]
