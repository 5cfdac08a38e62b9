"""GPU memory cap arithmetic: pod portion × Ray's num_gpus share − CUDA context headroom.

Pure: inputs are the parsed pod env, what Ray assigned to this process and the device memory
sizes that are known; the result explains itself (`GpuCap.why`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kai_ray.ray.gpu_env import HEADROOM_MIB, GpuEnvError, PodGpuEnv

MIB = 1 << 20


@dataclass(frozen=True)
class RayShare:
    """What Ray assigned to the current process."""

    in_ray_worker: bool  # False in a driver, notebook or plain process
    num_gpus: float  # Ray's assigned GPU amount (0 when none)
    gpu_ids: tuple[str, ...]  # Ray GPU ids in this process's CUDA order
    label: str  # "actor 1a2b…", "task 3c4d…", "driver"
    key: str = ""  # actor or task id: a reused worker process gets a new key per task


@dataclass(frozen=True)
class DeviceCap:
    """The cap on one device as this process sees it (CUDA ordinal `cuda_index`)."""

    cuda_index: int
    ray_gpu_id: str | None
    pod_index: int | None  # index into the pod's devices (NVML index in the container)
    uuid: str | None  # from NVIDIA_VISIBLE_DEVICES when the binder set it
    share: float | None  # fraction of the device this process is entitled to, before headroom
    limit_bytes: int | None  # the same entitlement in bytes, when known
    total_bytes: int | None  # device memory, when known
    total_source: str | None  # "nvml" or the config variable
    headroom_bytes: int
    cap_bytes: int | None  # what the frameworks may allocate: limit − headroom
    fraction: float | None  # cap_bytes / total_bytes
    explicit_limit: bool = False  # gpu-memory pods: the limit is MiB, not a share

    def resolve(self, total_bytes: int) -> tuple[float, int]:
        """(fraction, bytes) of a device of `total_bytes`: for frameworks that know the size."""
        if self.explicit_limit or self.share is None:
            limit = self.limit_bytes or 0
        else:
            limit = int(self.share * total_bytes)
        cap = max(0, min(limit, total_bytes) - self.headroom_bytes)
        return cap / total_bytes, cap


@dataclass(frozen=True)
class GpuCap:
    """The cap for this process, or the reason there is none."""

    active: bool
    mode: str  # "fraction" (gpu-fraction pod), "memory" (gpu-memory pod), "forced", "none"
    devices: tuple[DeviceCap, ...] = ()
    why: tuple[str, ...] = field(default_factory=tuple)

    def min_fraction(self) -> float | None:
        """The smallest cap fraction over the devices (None if any device's size is unknown)."""
        values = [d.fraction for d in self.devices]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    def min_share(self) -> float | None:
        """The smallest entitlement fraction, headroom not subtracted (None if unknown)."""
        values = [d.share for d in self.devices]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    def min_cap_bytes(self) -> int | None:
        values = [d.cap_bytes for d in self.devices]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)


def pod_index_of(ray_gpu_id: str, devices: tuple[str, ...]) -> int | None:
    """Ray numbers the pod's GPUs 0..n-1 (or uses the ids of CUDA_VISIBLE_DEVICES, maybe UUIDs)."""
    if ray_gpu_id.isdigit():
        return int(ray_gpu_id)
    if ray_gpu_id in devices:
        return devices.index(ray_gpu_id)
    return None


def _fmt_mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def compute_cap(
    pod: PodGpuEnv,
    ray: RayShare,
    totals: Mapping[int, int],
    totals_source: str | None,
    *,
    force: bool = False,
) -> GpuCap:
    """The cap this process should apply. `totals`: device memory in bytes by pod device index."""
    why: list[str] = []
    if pod.cap_mode == "off" and not force:
        return GpuCap(False, "none", why=("KAI_RAY_GPU_CAP=off: capping disabled",))
    if not pod.fractional and pod.cap_mode != "on" and not force:
        return GpuCap(False, "none", why=(
            "whole-GPU pod (no GPU_PORTION below 1, no KAI_RAY_GPU_MEMORY_LIMIT_MIB): no cap; "
            "set KAI_RAY_GPU_CAP=on to cap each process at its Ray num_gpus share",
        ))

    portion = pod.portion if pod.portion is not None else 1.0
    if pod.memory_limit_mib is not None:
        mode = "memory"
        why.append(f"gpu-memory pod: {pod.memory_limit_mib} MiB on each device "
                   "(KAI_RAY_GPU_MEMORY_LIMIT_MIB)")
    elif pod.fractional:
        mode = "fraction"
        why.append(f"gpu-fraction pod: {portion:g} of each device ({pod.portion_var})")
    else:
        mode = "forced"
        why.append("whole-GPU pod capped on request (KAI_RAY_GPU_CAP=on): portion 1")

    # per-device multiplier from Ray: num_gpus g < 1 shares one Ray GPU, g >= 1 owns whole ones
    if ray.in_ray_worker:
        if ray.num_gpus <= 0 or not ray.gpu_ids:
            why.append(f"Ray assigned no GPU to this {ray.label}: nothing to cap")
            return GpuCap(False, mode, why=tuple(why))
        per = ray.num_gpus if ray.num_gpus < 1 else 1.0
        ids: tuple[str | None, ...] = ray.gpu_ids
        if ray.num_gpus < 1:
            why.append(f"Ray gave this {ray.label} num_gpus={ray.num_gpus:g} of Ray GPU "
                       f"{ray.gpu_ids[0]}: it gets {ray.num_gpus:g} of the pod's share")
        else:
            why.append(f"Ray gave this {ray.label} num_gpus={ray.num_gpus:g} "
                       f"(Ray GPUs {', '.join(ray.gpu_ids)}): the pod's full share on each")
    else:
        per = 1.0
        count = len(pod.devices) or len(totals) or 1
        ids = tuple(str(i) for i in range(count))
        why.append(f"{ray.label} (not a Ray task or actor): the pod's full share on each of "
                   f"its {count} visible device(s)")

    headroom = pod.headroom_mib * MIB
    devices: list[DeviceCap] = []
    for cuda_index, ray_id in enumerate(ids):
        pidx = pod_index_of(ray_id, pod.devices) if ray_id is not None else None
        uuid = pod.devices[pidx] if pidx is not None and pidx < len(pod.devices) else None
        if pod.devices and (pidx is None or pidx >= len(pod.devices)):
            why.append(f"Ray GPU {ray_id} has no entry in NVIDIA_VISIBLE_DEVICES "
                       f"({len(pod.devices)} device(s)): check rayStartParams num-gpus")
        total = totals.get(pidx) if pidx is not None else None
        if total is None and len(set(totals.values())) == 1:
            total = next(iter(totals.values()))  # identical devices: any size will do
        share: float | None
        if pod.memory_limit_mib is not None:
            explicit = int(per * pod.memory_limit_mib * MIB)
            limit: int | None = explicit
            share = None if total is None else min(1.0, explicit / total)
        else:
            share = per * portion
            limit = None if total is None else int(share * total)
        if limit is not None and total is not None and limit > total:
            why.append(f"device {cuda_index}: limit {_fmt_mib(limit)} exceeds the device's "
                       f"{_fmt_mib(total)}; capped at the device size")
            limit = total
        cap_bytes = None if limit is None else limit - headroom
        if cap_bytes is not None and cap_bytes <= 0:
            raise GpuEnvError(HEADROOM_MIB, str(pod.headroom_mib),
                              f"leaves no memory: this process's share of device {cuda_index} "
                              f"is only {_fmt_mib(limit or 0)}")
        fraction = None if cap_bytes is None or total is None else cap_bytes / total
        devices.append(DeviceCap(
            cuda_index=cuda_index, ray_gpu_id=ray_id if ray.in_ray_worker else None,
            pod_index=pidx, uuid=uuid, share=share, limit_bytes=limit, total_bytes=total,
            total_source=totals_source if total is not None else None,
            headroom_bytes=headroom, cap_bytes=cap_bytes, fraction=fraction,
            explicit_limit=pod.memory_limit_mib is not None,
        ))
    if any(d.total_bytes is None for d in devices):
        why.append("device memory unknown (no NVML, no KAI_RAY_GPU_MEMORY_MIB): frameworks that "
                   "know the device size subtract the headroom themselves; env-based caps "
                   "(JAX, CuPy %) use the share without headroom")
    else:
        why.append(f"device memory from {totals_source}; {pod.headroom_mib} MiB headroom "
                   "per process for the CUDA context (KAI_RAY_GPU_HEADROOM_MIB)")
    return GpuCap(True, mode, tuple(devices), tuple(why))
