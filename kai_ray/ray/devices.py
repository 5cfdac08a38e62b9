"""Device memory sizes: NVML (`nvidia-ml-py`, imported lazily) when it works, else configuration."""

from __future__ import annotations

import contextlib

from kai_ray.ray.caps import MIB
from kai_ray.ray.gpu_env import GPU_MEMORY_MIB, PodGpuEnv

_nvml_cache: tuple[dict[int, int], str | None] | None = None


def _nvml_totals() -> tuple[dict[int, int], str | None]:
    """{container device index: bytes} from NVML, or ({}, why not). Cached per process."""
    global _nvml_cache
    if _nvml_cache is not None:
        return _nvml_cache
    try:
        import pynvml
    except ImportError:
        _nvml_cache = ({}, "nvidia-ml-py is not installed")
        return _nvml_cache
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver / no device: NVML raises its own error types
        _nvml_cache = ({}, f"NVML unavailable: {e}")
        return _nvml_cache
    try:
        totals = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            totals[i] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        _nvml_cache = (totals, None)
    except Exception as e:
        _nvml_cache = ({}, f"NVML query failed: {e}")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return _nvml_cache


def device_totals(pod: PodGpuEnv) -> tuple[dict[int, int], str | None, str | None]:
    """(bytes by device index, source, note): NVML first, then KAI_RAY_GPU_MEMORY_MIB."""
    if pod.nvml_mode == "off":
        totals, problem = {}, "NVML not used (KAI_RAY_NVML=off)"
    else:
        totals, problem = _nvml_totals()
    if totals:
        return totals, "nvml", None
    if pod.device_memory_mib is not None:
        count = max(len(pod.devices), 1)
        size = pod.device_memory_mib * MIB
        return {i: size for i in range(count)}, GPU_MEMORY_MIB, problem
    return {}, None, problem
