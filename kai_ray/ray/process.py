"""The cap of the current process: compute it from the pod env and Ray, apply it, report it.

Three ways in, all ending in `cap_gpu_memory()`:
- `runtime_env()` for `ray.init(runtime_env=...)`: a worker_process_setup_hook arms import hooks
  in every worker; the cap is applied when a framework is imported inside a task or actor (the
  setup hook itself runs before Ray assigns GPUs, so it only arms);
- `@gpu_capped` on an actor class (or task function), or the `GpuCapped` mixin;
- `cap_gpu_memory()` called at the top of a task, an actor method or a notebook cell.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TextIO, TypeVar

from kai_ray.ray import frameworks as fw
from kai_ray.ray.caps import MIB, GpuCap, RayShare, compute_cap
from kai_ray.ray.devices import device_totals
from kai_ray.ray.gpu_env import (
    CAP_MODE,
    GPU_MEMORY_MIB,
    HEADROOM_MIB,
    MPS_MODE,
    GpuEnvError,
    PodGpuEnv,
    parse_pod_env,
)
from kai_ray.ray.import_hooks import on_import

SETUP_HOOK = "kai_ray.ray.process.worker_setup_hook"


@dataclass
class CapReport:
    """What `current_cap()` returns: the cap in this process and what was done with it."""

    active: bool
    mode: str
    process: str
    pid: int
    devices: list[dict[str, Any]]
    frameworks: dict[str, dict[str, Any]]
    why: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def capped_frameworks(self) -> list[str]:
        return sorted(n for n, r in self.frameworks.items() if r["status"] == fw.APPLIED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "active": self.active, "mode": self.mode, "process": self.process, "pid": self.pid,
            "devices": [dict(d) for d in self.devices],
            "frameworks": {k: dict(v) for k, v in self.frameworks.items()},
            "capped_frameworks": self.capped_frameworks,
            "why": list(self.why), "notes": list(self.notes),
        }


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pod: PodGpuEnv | None = None
        self.ray: RayShare | None = None
        self.cap: GpuCap | None = None
        self.results: dict[str, fw.FrameworkResult] = {}
        self.notes: list[str] = []
        self.armed = False  # import hooks installed
        self.in_setup_hook = False


_state = _State()


# ------------------------------------------------------------------------------ Ray share


def _ray_share() -> RayShare | None:
    """What Ray assigned to this process; None while a Ray worker has no task yet."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return RayShare(False, 0.0, (), "process")
    ctx = ray.get_runtime_context()
    worker_mode = getattr(ray, "WORKER_MODE", None)
    if worker_mode is None:
        from ray._private.worker import WORKER_MODE as worker_mode
    if ctx.worker.mode != worker_mode:
        return RayShare(False, 0.0, (), "Ray driver")
    if _state.in_setup_hook:
        return None
    resources = ctx.get_assigned_resources()
    ids = tuple(str(i) for i in ctx.get_accelerator_ids().get("GPU", []))
    actor = ctx.get_actor_id()
    key = actor or ctx.get_task_id() or "?"
    label = f"actor {key[:8]}" if actor else f"task {key[:8]}"
    return RayShare(True, float(resources.get("GPU", 0.0)), ids, label, key)


# --------------------------------------------------------------------------------- apply


def _record(result: fw.FrameworkResult) -> None:
    with _state.lock:
        _state.results[result.framework] = result


def _run(adapter: Callable[[], fw.FrameworkResult], name: str) -> None:
    try:
        _record(adapter())
    except GpuEnvError:
        raise
    except Exception as e:  # a framework rejected the setting: say so, never hide it
        _record(fw.FrameworkResult(name, fw.FAILED, f"{type(e).__name__}: {e}"))
        warnings.warn(f"kai_ray: could not cap {name}: {e}", RuntimeWarning, stacklevel=3)


def _compute(force: bool) -> tuple[PodGpuEnv, RayShare | None, GpuCap | None]:
    pod = parse_pod_env(os.environ)
    share = _ray_share()
    if share is None:
        return pod, None, None
    totals, source, problem = device_totals(pod)
    cap = compute_cap(pod, share, totals, source, force=force)
    if problem and cap.active:
        cap = GpuCap(cap.active, cap.mode, cap.devices, (*cap.why, f"NVML: {problem}"))
    return pod, share, cap


def cap_gpu_memory(*, force: bool = False) -> CapReport:
    """Compute this process's cap and apply it to every framework present; return the report.

    Call it at the start of a task or actor (before the framework allocates) or in a notebook.
    `force=True` caps a whole-GPU pod too (at its Ray num_gpus share). Raises `GpuEnvError`
    naming the variable when the pod's GPU env is malformed.
    """
    with _state.lock:
        _arm()
        pod, share, cap = _compute(force)
        _state.pod, _state.ray, _state.cap = pod, share, cap
        if cap is None:
            _state.notes = ["Ray has not assigned resources yet (worker setup): the cap is "
                            "applied when a task or actor starts using a framework"]
            return _report()
        _state.notes = []
        if not cap.active:
            fw.restore_env()
            _state.results = {}
            return _report()
        _run(lambda: fw.apply_mps(cap, pod), "mps")
        _run(lambda: fw.apply_jax(cap), "jax")
        _run(lambda: fw.apply_cupy(cap), "cupy")
        _run(lambda: fw.apply_torch(cap, _record), "torch")
        _run(lambda: fw.apply_tensorflow(cap), "tensorflow")
        return _report()


def _first_use() -> bool:
    """A hook fired before this task or actor applied its cap: apply it to everything now."""
    if _state.cap is not None and _state.ray is not None:
        if not _state.ray.in_ray_worker:
            return False
        now = _ray_share()
        if now is None or now.key == _state.ray.key:
            return False
    report = cap_gpu_memory()
    return report.mode != "pending"


def _before(name: str) -> Callable[[str], None]:
    adapter = {"jax": fw.apply_jax, "cupy": fw.apply_cupy}[name]

    def hook(_: str) -> None:
        with _state.lock:
            if _first_use():
                return
            cap = _state.cap
            if cap is not None and cap.active:
                _run(lambda: adapter(cap), name)

    return hook


def _after(name: str) -> Callable[[ModuleType], None]:
    def hook(_: ModuleType) -> None:
        with _state.lock:
            if _first_use():
                return
            cap = _state.cap
            if cap is None or not cap.active:
                return
            if name == "torch":
                _run(lambda: fw.apply_torch(cap, _record), name)
            else:
                _run(lambda: fw.apply_tensorflow(cap), name)

    return hook


_BEFORE_HOOKS = {name: _before(name) for name in ("jax", "cupy")}
_AFTER_HOOKS = {name: _after(name) for name in ("torch", "tensorflow")}


def _arm() -> None:
    if _state.armed:
        return
    for name, before in _BEFORE_HOOKS.items():
        on_import(name, before=before)
    for name, after in _AFTER_HOOKS.items():
        on_import(name, after=after)
    _state.armed = True


# -------------------------------------------------------------------------------- report


def _report() -> CapReport:
    cap, share = _state.cap, _state.ray
    process = share.label if share is not None else "Ray worker (no task yet)"
    devices = []
    for d in cap.devices if cap is not None else ():
        devices.append({
            "cuda_index": d.cuda_index, "ray_gpu_id": d.ray_gpu_id, "uuid": d.uuid,
            "share": d.share, "fraction": d.fraction, "cap_bytes": d.cap_bytes,
            "limit_bytes": d.limit_bytes, "total_bytes": d.total_bytes,
            "total_source": d.total_source, "headroom_bytes": d.headroom_bytes,
        })
    return CapReport(
        active=bool(cap is not None and cap.active),
        mode=cap.mode if cap is not None else "pending",
        process=process, pid=os.getpid(), devices=devices,
        frameworks={k: v.as_dict() for k, v in sorted(_state.results.items())},
        why=list(cap.why) if cap is not None else [], notes=list(_state.notes),
    )


def current_cap() -> CapReport:
    """The cap that applies in this process and which frameworks were capped.

    In a Ray task or actor whose cap was not applied yet (runtime_env only, no framework
    imported), this applies it now; elsewhere it reports without changing anything.
    """
    with _state.lock:
        share = _ray_share()
        stale = (share is not None and share.in_ray_worker
                 and (_state.ray is None or _state.ray.key != share.key))
        if stale or _state.cap is None or _state.ray is None:
            if share is not None and (share.in_ray_worker or _state.armed):
                return cap_gpu_memory()
            pod, share, cap = _compute(False)
            _state.pod, _state.ray, _state.cap = pod, share, cap
            if cap is not None and cap.active:
                _state.notes = ["not applied in this process yet: call "
                                "kai_ray.ray.cap_gpu_memory()"]
        return _report()


def _fmt(n: int | None) -> str:
    return "?" if n is None else f"{n / MIB:.0f} MiB"


def describe(file: TextIO | None = None) -> str:
    """Print (and return) the cap in this process and why."""
    r = current_cap()
    lines = [f"kai-ray GPU memory cap: {r.process} (pid {r.pid}): "
             + (f"{r.mode} cap" if r.active else "no cap")]
    lines += [f"  why: {w}" for w in r.why]
    for d in r.devices:
        frac = "?" if d["fraction"] is None else f"{d['fraction']:.4f}"
        share = "?" if d["share"] is None else f"{d['share']:.4f}"
        where = f"Ray GPU {d['ray_gpu_id']}" if d["ray_gpu_id"] is not None else "device"
        lines.append(
            f"  cuda:{d['cuda_index']} ({where}{', ' + d['uuid'] if d['uuid'] else ''}): "
            f"share {share} -> cap {frac} = {_fmt(d['cap_bytes'])} of {_fmt(d['total_bytes'])}"
            f" (headroom {_fmt(d['headroom_bytes'])})")
    for name, res in r.frameworks.items():
        settings = ", ".join(f"{k}={v}" for k, v in res["settings"].items())
        lines.append(f"  {name}: {res['status']}: {res['detail']}"
                     + (f" [{settings}]" if settings else ""))
    lines += [f"  note: {n}" for n in r.notes]
    text = "\n".join(lines)
    print(text, file=file if file is not None else sys.stdout)
    return text


# ---------------------------------------------------------------------------------- vLLM


def vllm_gpu_memory_utilization() -> float | None:
    """`gpu_memory_utilization` for a vLLM engine created in this process (None: no cap)."""
    if _state.cap is None:
        cap_gpu_memory()
    cap = _state.cap
    value = fw.vllm_gpu_memory_utilization(cap) if cap is not None else None
    if value is not None:
        _record(fw.FrameworkResult("vllm", fw.APPLIED, "handed out gpu_memory_utilization for "
                                   "a vLLM engine", {"gpu_memory_utilization": f"{value}"}))
    return value


def vllm_engine_kwargs(**kwargs: Any) -> dict[str, Any]:
    """`kwargs` plus the capped `gpu_memory_utilization` (a smaller user value is kept)."""
    value = vllm_gpu_memory_utilization()
    out = dict(kwargs)
    if value is not None:
        user = out.get("gpu_memory_utilization")
        out["gpu_memory_utilization"] = value if user is None else min(float(user), value)
    return out


# --------------------------------------------------------------------------- Ray wiring


def worker_setup_hook() -> None:
    """Ray's worker_process_setup_hook: validate the env and arm the import hooks.

    Ray runs it before any task is assigned, so the cap itself is applied later.
    """
    with _state.lock:
        _state.in_setup_hook = True
        try:
            cap_gpu_memory()
        except GpuEnvError as e:
            # a failing setup hook only kills the worker with a generic message; the same
            # error is raised again, naming the variable, when the task or actor applies its cap
            warnings.warn(f"kai_ray: {e}", RuntimeWarning, stacklevel=2)
        finally:
            _state.in_setup_hook = False
            _state.cap = None  # computed again inside the first task or actor


def runtime_env(
    base: Mapping[str, Any] | None = None,
    *,
    headroom_mib: int | None = None,
    gpu_memory_mib: int | None = None,
    cap: str | None = None,
    mps: str | None = None,
) -> dict[str, Any]:
    """A runtime_env for `ray.init(runtime_env=...)` (or a job/actor) that caps every worker.

    `base`: the rest of your runtime_env (env_vars are merged). The keyword options become the
    KAI_RAY_* variables documented in docs/gpu-env.md.
    """
    env: dict[str, Any] = dict(base or {})
    hook = env.get("worker_process_setup_hook")
    if hook is not None and hook != SETUP_HOOK:
        raise ValueError(f"runtime_env already has worker_process_setup_hook={hook!r}; Ray runs "
                         f"only one: call {SETUP_HOOK}() from yours instead")
    env["worker_process_setup_hook"] = SETUP_HOOK
    env_vars = dict(env.get("env_vars") or {})
    for name, value in ((HEADROOM_MIB, headroom_mib), (GPU_MEMORY_MIB, gpu_memory_mib),
                        (CAP_MODE, cap), (MPS_MODE, mps)):
        if value is not None:
            env_vars[name] = str(value)
    parse_pod_env(env_vars)  # reject bad options here rather than in every worker
    if env_vars:
        env["env_vars"] = env_vars
    return env


T = TypeVar("T")


def gpu_capped(target: T) -> T:
    """Decorate an actor class (its __init__ first applies the cap) or a task function."""
    if inspect.isclass(target):
        original = target.__init__

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            cap_gpu_memory()
            original(self, *args, **kwargs)

        target.__init__ = __init__  # type: ignore[method-assign]
        return target
    if callable(target):
        fn: Callable[..., Any] = target

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            cap_gpu_memory()
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
    raise TypeError(f"gpu_capped expects a class or a function, got {type(target).__name__}")


class GpuCapped:
    """Mixin for actor classes: the cap is applied before any __init__ runs."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        cap_gpu_memory()
        return super().__new__(cls)
