"""The environment contract between kai-ray's binder and the Ray-side helper (docs/gpu-env.md).

Pure: parses a mapping of environment variables into a `PodGpuEnv`; every bad value raises
`GpuEnvError` naming the variable. No os access here, so the cap arithmetic stays testable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Set by the binder (KAI's names).
GPU_PORTION = "GPU_PORTION"
RUNAI_NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"  # KAI's deprecated twin of GPU_PORTION
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Set by kai-ray's binder for `gpu-memory` pods only (KAI has no such variable).
GPU_MEMORY_LIMIT_MIB = "KAI_RAY_GPU_MEMORY_LIMIT_MIB"

# Optional user / platform configuration.
GPU_MEMORY_MIB = "KAI_RAY_GPU_MEMORY_MIB"  # device memory when NVML is missing
HEADROOM_MIB = "KAI_RAY_GPU_HEADROOM_MIB"  # left for the CUDA context of each process
CAP_MODE = "KAI_RAY_GPU_CAP"  # auto | on | off
MPS_MODE = "KAI_RAY_MPS_LIMIT"  # auto | on | off
NVML_MODE = "KAI_RAY_NVML"  # auto | off (off: trust KAI_RAY_GPU_MEMORY_MIB, e.g. MIG or tests)

DEFAULT_HEADROOM_MIB = 256
CAP_MODES = ("auto", "on", "off")
MPS_MODES = ("auto", "on", "off")
NVML_MODES = ("auto", "off")

# NVIDIA_VISIBLE_DEVICES values that name no concrete device list.
_NO_DEVICE_LIST = {"", "all", "none", "void"}


class GpuEnvError(ValueError):
    """A GPU environment variable has a value the helper cannot use; the message names it."""

    def __init__(self, variable: str, value: str, problem: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(f"{variable}={value!r}: {problem}")


@dataclass(frozen=True)
class PodGpuEnv:
    """What the pod was given, as the binder and the user configured it."""

    portion: float | None  # share of each visible device; None = whole-GPU or non-KAI pod
    portion_var: str | None  # which variable the portion came from
    memory_limit_mib: int | None  # gpu-memory pods: MiB per device
    devices: tuple[str, ...]  # NVIDIA_VISIBLE_DEVICES entries (GPU UUIDs), in order
    device_memory_mib: int | None  # configured device memory (fallback for NVML)
    headroom_mib: int
    cap_mode: str
    mps_mode: str
    nvml_mode: str = "auto"

    @property
    def fractional(self) -> bool:
        """True for gpu-fraction and gpu-memory pods: they share their devices."""
        return self.memory_limit_mib is not None or (
            self.portion is not None and self.portion < 1.0
        )


def _number(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        raise GpuEnvError(name, raw, "not a number") from None
    if not math.isfinite(value):
        raise GpuEnvError(name, raw, "not a finite number")
    return value


def _positive_int(env: Mapping[str, str], name: str, *, allow_zero: bool = False) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise GpuEnvError(name, raw, "not an integer number of MiB") from None
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise GpuEnvError(name, raw, f"must be {bound} MiB")
    return value


def _mode(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return "auto"
    value = raw.strip().lower()
    if value not in allowed:
        raise GpuEnvError(name, raw, f"must be one of {', '.join(allowed)}")
    return value


def parse_devices(raw: str | None) -> tuple[str, ...]:
    """NVIDIA_VISIBLE_DEVICES as a list; `all`/`none`/`void`/unset give an empty tuple."""
    if raw is None or raw.strip().lower() in _NO_DEVICE_LIST:
        return ()
    entries = [part.strip() for part in raw.split(",")]
    return tuple(entry for entry in entries if entry)


def parse_pod_env(env: Mapping[str, str]) -> PodGpuEnv:
    """Parse the pod's GPU environment; raise `GpuEnvError` naming the first bad variable."""
    portion_var: str | None = None
    portion: float | None = None
    for name in (GPU_PORTION, RUNAI_NUM_OF_GPUS):
        value = _number(env, name)
        if value is None:
            continue
        if name == RUNAI_NUM_OF_GPUS and value >= 1.0:
            if not value.is_integer():  # neither a count nor a portion: never guess which
                raise GpuEnvError(name, env[name], "a whole-GPU count must be an integer, "
                                                   "a portion must be > 0 and <= 1")
            continue  # a whole-GPU count there, not a portion of one device
        if not 0.0 < value <= 1.0:
            raise GpuEnvError(name, env[name], "a GPU portion must be > 0 and <= 1")
        portion, portion_var = value, name
        break
    return PodGpuEnv(
        portion=portion,
        portion_var=portion_var,
        memory_limit_mib=_positive_int(env, GPU_MEMORY_LIMIT_MIB),
        devices=parse_devices(env.get(NVIDIA_VISIBLE_DEVICES)),
        device_memory_mib=_positive_int(env, GPU_MEMORY_MIB),
        headroom_mib=(
            DEFAULT_HEADROOM_MIB
            if (h := _positive_int(env, HEADROOM_MIB, allow_zero=True)) is None
            else h
        ),
        cap_mode=_mode(env, CAP_MODE, CAP_MODES),
        mps_mode=_mode(env, MPS_MODE, MPS_MODES),
        nvml_mode=_mode(env, NVML_MODE, NVML_MODES),
    )
