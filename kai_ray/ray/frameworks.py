"""Framework adapters: turn a `GpuCap` into each framework's own memory limit.

Every adapter returns a `FrameworkResult` that says what was set and whether it can still take
effect; none imports its framework (it acts on an already-imported module or on env vars read
later). Statuses:
  applied        the limit is in force now, or set where the framework will read it
  deferred       armed: applies when the framework is imported / initialises CUDA
  too-late       the framework already initialised its GPU state: nothing was changed
  not-installed  the package is absent
  no-gpu         the framework sees no GPU in this process
  skipped        not enough information (e.g. device memory unknown) or disabled
  failed         the framework rejected the setting
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kai_ray.ray.caps import MIB, DeviceCap, GpuCap
from kai_ray.ray.gpu_env import PodGpuEnv
from kai_ray.ray.import_hooks import is_installed

APPLIED, DEFERRED, TOO_LATE = "applied", "deferred", "too-late"
NOT_INSTALLED, NO_GPU, SKIPPED, FAILED = "not-installed", "no-gpu", "skipped", "failed"

JAX_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
CUPY_LIMIT_VAR = "CUPY_GPU_MEMORY_LIMIT"
MPS_LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"


@dataclass
class FrameworkResult:
    framework: str
    status: str
    detail: str
    settings: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "settings": dict(self.settings)}


# env vars this helper set, with the value it set and what was there before (to undo)
_ours: dict[str, tuple[str, str | None]] = {}


def set_env(name: str, value: str) -> None:
    if name not in _ours:
        _ours[name] = (value, os.environ.get(name))
    else:
        _ours[name] = (value, _ours[name][1])
    os.environ[name] = value


def user_value(name: str) -> str | None:
    """The variable's value if the user (not this helper) set it."""
    current = os.environ.get(name)
    if current is None:
        return None
    if name in _ours and _ours[name][0] == current:
        return None
    return current


def restore_env() -> None:
    """Undo every env var this helper set (a later task in the process is not capped)."""
    for name, (value, before) in list(_ours.items()):
        if os.environ.get(name) == value:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        del _ours[name]


def _floor(x: float, digits: int = 4) -> float:
    """Round down so a setting never exceeds the cap."""
    scale = 10.0**digits
    return float(math.floor(x * scale)) / scale


def env_fraction(cap: GpuCap) -> tuple[float | None, str]:
    """One fraction for frameworks configured by a single env var: the smallest device's."""
    fraction = cap.min_fraction()
    if fraction is not None:
        return _floor(fraction), ""
    share = cap.min_share()
    if share is not None:
        return _floor(share), " (device memory unknown: CUDA-context headroom not subtracted)"
    return None, ""


# ----------------------------------------------------------------------------------- JAX


def jax_fraction_var() -> str:
    """XLA_CLIENT_MEM_FRACTION where the installed jaxlib reads it, else the older name.

    Never both: current jaxlib refuses to start its GPU client when both are set.
    """
    spec = None
    try:
        from importlib.util import find_spec

        spec = find_spec("jaxlib")
    except (ImportError, ValueError):
        pass
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            try:
                with open(os.path.join(base, "xla_client.py"), encoding="utf-8") as f:
                    if JAX_FRACTION_VARS[0] in f.read():
                        return JAX_FRACTION_VARS[0]
            except OSError:
                continue
    return JAX_FRACTION_VARS[1]


def jax_backend_initialised() -> bool:
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # private module moved: assume the worst only if jax ran something
        return False


def apply_jax(cap: GpuCap) -> FrameworkResult:
    fraction, note = env_fraction(cap)
    if fraction is None:
        return FrameworkResult("jax", SKIPPED, "JAX needs a fraction but the device memory is "
                               "unknown (install nvidia-ml-py or set KAI_RAY_GPU_MEMORY_MIB)")
    if jax_backend_initialised():
        return FrameworkResult("jax", TOO_LATE, "JAX already created its backends; XLA reads the "
                               "memory fraction only then. Apply the cap before the first JAX "
                               "operation (decorator, mixin or runtime_env)")
    value = f"{fraction:.4f}"
    for name in JAX_FRACTION_VARS:
        theirs = user_value(name)
        if theirs is None:
            continue
        try:
            keep = float(theirs) <= fraction
        except ValueError:
            keep = False
        if keep:
            return FrameworkResult("jax", APPLIED, f"kept the user's {name}={theirs} "
                                   f"(<= cap {value})", {name: theirs})
        set_env(name, value)  # same spelling as the user's: setting both breaks jaxlib
        return FrameworkResult("jax", APPLIED, f"lowered the user's {name}={theirs} to the "
                               f"cap{note}", {name: value})
    name = jax_fraction_var()
    set_env(name, value)
    when = ("before JAX initialised its backend" if "jax" in sys.modules
            else "before JAX was imported")
    return FrameworkResult("jax", APPLIED, f"set {name}={value} {when}{note}", {name: value})


# ---------------------------------------------------------------------------------- CuPy


def _cupy_within(theirs: str, limit_bytes: int | None, share: float | None) -> bool:
    """Whether the user's CUPY_GPU_MEMORY_LIMIT is already at or below the cap."""
    try:
        if theirs.strip().endswith("%"):
            return share is not None and float(theirs.strip()[:-1]) / 100 <= share
        return limit_bytes is not None and int(theirs) <= limit_bytes
    except ValueError:
        return False


def apply_cupy(cap: GpuCap) -> FrameworkResult:
    limit_bytes = cap.min_cap_bytes()
    share = cap.min_share()
    if limit_bytes is not None:
        value = str(limit_bytes)
    elif share is not None:
        value = f"{_floor(share * 100, 2)}%"
    else:
        return FrameworkResult("cupy", SKIPPED, "device memory unknown")
    theirs = user_value(CUPY_LIMIT_VAR)
    if theirs is None or not _cupy_within(theirs, limit_bytes, share):
        set_env(CUPY_LIMIT_VAR, value)
    settings = {CUPY_LIMIT_VAR: os.environ[CUPY_LIMIT_VAR]}
    if "cupy" not in sys.modules:
        if not is_installed("cupy"):
            return FrameworkResult("cupy", NOT_INSTALLED, "CuPy is not installed: nothing to cap "
                                   f"({CUPY_LIMIT_VAR}={value} is set should it be imported later)",
                                   settings)
        return FrameworkResult("cupy", APPLIED, f"set {CUPY_LIMIT_VAR}={value} before CuPy was "
                               "imported", settings)
    cupy = sys.modules["cupy"]
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        return FrameworkResult("cupy", NO_GPU, f"CuPy sees no CUDA device ({e})", settings)
    pool = cupy.get_default_memory_pool()
    for i in range(count):
        dev = cap.devices[min(i, len(cap.devices) - 1)]
        with cupy.cuda.Device(i):
            if dev.cap_bytes is not None:
                pool.set_limit(size=dev.cap_bytes)
            elif dev.share is not None:
                pool.set_limit(fraction=dev.share)
            settings[f"pool_limit[{i}]"] = str(pool.get_limit())
    return FrameworkResult("cupy", APPLIED, "set the default memory pool limit on "
                           f"{count} device(s)", settings)


# ------------------------------------------------------------------------------- PyTorch


def _torch_set(torch: Any, cap: GpuCap) -> dict[str, str]:
    settings: dict[str, str] = {}
    for i in range(torch.cuda.device_count()):
        dev: DeviceCap = cap.devices[min(i, len(cap.devices) - 1)]
        total = int(torch.cuda.get_device_properties(i).total_memory)
        fraction, cap_bytes = dev.resolve(total)
        torch.cuda.set_per_process_memory_fraction(fraction, i)
        read_back = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        settings[f"memory_fraction[{i}]"] = (
            f"{read_back(i):.6f}" if read_back is not None else f"{fraction:.6f}"
        )
        settings[f"cap_bytes[{i}]"] = str(cap_bytes)
        reserved = int(torch.cuda.memory_reserved(i))
        if reserved > cap_bytes:
            settings[f"already_reserved[{i}]"] = str(reserved)
    return settings


def apply_torch(cap: GpuCap, record: Callable[[FrameworkResult], None]) -> FrameworkResult:
    """Set torch's per-process memory fraction now, or queue it for torch's CUDA init."""
    if "torch" not in sys.modules:
        if not is_installed("torch"):
            return FrameworkResult("torch", NOT_INSTALLED, "PyTorch is not installed")
        return FrameworkResult("torch", DEFERRED, "armed: set when torch is imported")
    torch = sys.modules["torch"]
    try:
        available = bool(torch.cuda.is_available())
    except Exception:
        available = False
    if not available:
        return FrameworkResult("torch", NO_GPU, "torch sees no CUDA device: nothing to cap")
    if torch.cuda.is_initialized():
        settings = _torch_set(torch, cap)
        over = [k for k in settings if k.startswith("already_reserved")]
        if over:
            return FrameworkResult("torch", TOO_LATE, "set_per_process_memory_fraction is set, "
                                   "but torch already holds more than the cap on some device",
                                   settings)
        return FrameworkResult("torch", APPLIED, "set_per_process_memory_fraction on "
                               f"{torch.cuda.device_count()} device(s)", settings)

    def _at_cuda_init() -> None:
        record(FrameworkResult("torch", APPLIED, "set_per_process_memory_fraction when torch "
                               "initialised CUDA", _torch_set(torch, cap)))

    # torch runs queued calls inside its lazy CUDA init, before the first allocation
    torch.cuda._lazy_call(_at_cuda_init)
    return FrameworkResult("torch", DEFERRED, "queued: set_per_process_memory_fraction runs "
                           "when torch initialises CUDA, before its first allocation")


# ---------------------------------------------------------------------------- TensorFlow


def apply_tensorflow(cap: GpuCap) -> FrameworkResult:
    if "tensorflow" not in sys.modules:
        if not is_installed("tensorflow"):
            return FrameworkResult("tensorflow", NOT_INSTALLED, "TensorFlow is not installed")
        return FrameworkResult("tensorflow", DEFERRED, "armed: set when tensorflow is imported")
    tf = sys.modules["tensorflow"]
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return FrameworkResult("tensorflow", NO_GPU, "TensorFlow sees no GPU: nothing to cap")
    settings: dict[str, str] = {}
    for i, gpu in enumerate(gpus):
        dev = cap.devices[min(i, len(cap.devices) - 1)]
        if dev.cap_bytes is None:
            return FrameworkResult("tensorflow", SKIPPED, "TensorFlow takes a MiB limit but the "
                                   "device memory is unknown (install nvidia-ml-py or set "
                                   "KAI_RAY_GPU_MEMORY_MIB)")
        mib = dev.cap_bytes // MIB
        try:
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mib)])
        except RuntimeError as e:
            return FrameworkResult("tensorflow", TOO_LATE, "TensorFlow already initialised its "
                                   f"GPUs ({e})", settings)
        settings[f"memory_limit_mib[{i}]"] = str(mib)
    return FrameworkResult("tensorflow", APPLIED, "logical device memory_limit on "
                           f"{len(gpus)} GPU(s)", settings)


# ----------------------------------------------------------------------------------- MPS


def mps_in_use() -> tuple[bool, str]:
    pipe = os.environ.get(MPS_PIPE_VAR, MPS_DEFAULT_PIPE)
    try:
        entries = os.listdir(pipe)
    except OSError:
        return False, f"no MPS pipe directory at {pipe}"
    if "control" in entries or any(e.endswith(".pid") for e in entries):
        return True, f"MPS control daemon pipe found in {pipe}"
    return False, f"{pipe} holds no MPS control pipe"


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return True
    except Exception:
        pass
    return jax_backend_initialised()


def apply_mps(cap: GpuCap, pod: PodGpuEnv) -> FrameworkResult:
    """Hard limit through MPS: the client's pinned device memory, read at CUDA context creation."""
    if pod.mps_mode == "off":
        return FrameworkResult("mps", SKIPPED, "KAI_RAY_MPS_LIMIT=off")
    in_use, why = mps_in_use()
    if pod.mps_mode == "auto" and not in_use:
        return FrameworkResult("mps", SKIPPED, f"MPS not in use ({why})")
    if any(d.limit_bytes is None for d in cap.devices):
        return FrameworkResult("mps", SKIPPED, "MPS takes a byte limit but the device memory "
                               "is unknown")
    if _cuda_initialised():
        return FrameworkResult("mps", TOO_LATE, "CUDA is already initialised in this process; "
                               f"{MPS_LIMIT_VAR} is read when the CUDA context is created")
    # the whole entitlement: MPS bounds everything the process holds on the device
    value = ",".join(f"{d.cuda_index}={(d.limit_bytes or 0) // MIB}M" for d in cap.devices)
    theirs = user_value(MPS_LIMIT_VAR)
    if theirs is not None:
        return FrameworkResult("mps", APPLIED, f"kept the user's {MPS_LIMIT_VAR}={theirs}",
                               {MPS_LIMIT_VAR: theirs})
    set_env(MPS_LIMIT_VAR, value)
    return FrameworkResult("mps", APPLIED, f"set {MPS_LIMIT_VAR}={value} ({why})",
                           {MPS_LIMIT_VAR: value})


# ---------------------------------------------------------------------------------- vLLM


def vllm_gpu_memory_utilization(cap: GpuCap) -> float | None:
    """The `gpu_memory_utilization` for a vLLM engine in this process (None: no cap).

    vLLM budgets its whole process (CUDA context included) against this fraction of the
    device, so the entitlement is used without the headroom.
    """
    if not cap.active:
        return None
    share = cap.min_share()
    if share is None:
        return None
    return _floor(share)
