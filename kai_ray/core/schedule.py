"""`schedule(snapshot, config, now) -> CycleResult`: one KAI cycle, pure.

Two implementations take the same decisions: the Python core, the specification
(`kai_ray.core.python_cycle`), and the Rust engine in `native/` (module `kai_ray_native`).
`core="auto"` (the default) runs the Rust core when it is importable and takes the input (every
packing policy included), else the Python one, which is imported only then; tests compare the
two decision by decision (tests/core/test_native_core.py).
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from kai_ray.core.model import SchedulerConfig, Snapshot
from kai_ray.core.result import RESULT_TYPES, CycleResult

Clock = Callable[[], float]
Core = Literal["auto", "python", "native"]
CORES: tuple[Core, ...] = ("auto", "python", "native")
NATIVE_MODULE = "kai_ray_native"
# the calling convention this module speaks (kai_ray_native.ABI must match)
NATIVE_ABI = 1


class _Choice:
    """The process-wide default core (`set_default_core`) and the native module once found."""

    def __init__(self) -> None:
        self.default: Core = "auto"
        self.native: ModuleType | None = None
        self.looked = False  # the import was tried (a failed one is not retried every cycle)


_CHOICE = _Choice()


def set_default_core(core: Core) -> Core:
    """The core `schedule` runs when not told (`kai-ray ... --core`, test fixtures); returns
    the one before."""
    if core not in CORES:
        raise ValueError(f"core: expected one of {', '.join(CORES)}, got {core!r}")
    before = _CHOICE.default
    _CHOICE.default = core
    return before


def native_core(refresh: bool = False) -> ModuleType | None:
    """The Rust core when it is importable (built: see kai_ray.testing.native_core), else None.
    A failed import is remembered: `refresh` tries again (a module put on sys.path since). A
    module of another calling convention is refused rather than half-used."""
    if _CHOICE.native is None and (refresh or not _CHOICE.looked):
        _CHOICE.looked = True
        try:
            module = importlib.import_module(NATIVE_MODULE)
        except ImportError:
            return None
        abi = getattr(module, "ABI", None)
        if abi != NATIVE_ABI:
            raise ImportError(f"{NATIVE_MODULE} at {getattr(module, '__file__', '?')} speaks "
                              f"ABI {abi}, this kai_ray needs {NATIVE_ABI}: rebuild it")
        _CHOICE.native = module
    return _CHOICE.native


def describe_core() -> str:
    """Which core `schedule` runs by default, for logs: the Rust one, or the Python one."""
    if _CHOICE.default != "python" and native_core() is not None:
        return "native (Rust), the Python core for what it does not take"
    return "Python (the specification; the Rust core is not built or not chosen)"


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None, now: float = 0.0,
             clock: Clock | None = None, core: Core | None = None) -> CycleResult:
    """Run one cycle. `clock` (optional, injected by callers) only times the actions. `core`:
    "auto" (default, see the module doc), "python", or "native" (raises when the Rust core is
    not built or does not take this input).

    Python's cyclic garbage collector is paused for the cycle: the session holds every task
    and job, so each full collection walks them all, and it ran dozens of times a cycle.
    Memory is freed by reference counting meanwhile; cycles are collected when it resumes."""
    choice = core or _CHOICE.default
    if choice not in CORES:
        raise ValueError(f"core: expected one of {', '.join(CORES)}, got {choice!r}")
    config = config or SchedulerConfig()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if choice != "python":
            native = native_core(refresh=choice == "native")
            if native is None and choice == "native":
                raise RuntimeError(f"the native core ({NATIVE_MODULE}) is not built: "
                                   "python3 -m kai_ray.testing.native_core prints where it is")
            if native is not None:
                answer: Any = native.schedule(snapshot, config, now, clock, RESULT_TYPES)
                if isinstance(answer, CycleResult):
                    return answer
                if choice == "native":
                    raise ValueError(f"the native core does not take this input: {answer}")
        # imported here: a process on the Rust core never loads it (a third of kai-ray run's
        # imports, numpy included)
        from kai_ray.core.python_cycle import run_cycle

        return run_cycle(snapshot, config, now, clock)
    finally:
        if was_enabled:
            gc.enable()
