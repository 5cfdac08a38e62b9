"""Actors and tasks run by test_ray_caps.py inside real Ray workers (importable by them)."""

from __future__ import annotations

import os
from typing import Any

import kai_ray.ray as kr

JAX_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def jax_env() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in JAX_VARS}


def jax_probe() -> dict[str, Any]:
    """Import JAX here and read back the options its CUDA client would be created with."""
    before = jax_env()
    import jax  # noqa: F401  (the import is the point: the helper's import hook fires)
    from jax._src import xla_bridge
    from jaxlib import xla_client

    return {
        "env_before_import": before,
        "env_after_import": jax_env(),
        # the function JAX's CUDA plugin calls to build its client options from the env
        "plugin_options": {k: v for k, v in xla_client.generate_pjrt_gpu_plugin_options().items()
                           if k in ("memory_fraction", "preallocate")},
        "backends_initialised": xla_bridge.backends_are_initialized(),
    }


class _Probe:
    def __init__(self) -> None:
        self.env_at_init = jax_env()

    def report(self) -> dict[str, Any]:
        return kr.current_cap().as_dict()

    def jax(self) -> dict[str, Any]:
        return jax_probe()

    def describe(self) -> str:
        return kr.describe()

    def vllm_kwargs(self) -> dict[str, Any]:
        return kr.vllm_engine_kwargs(model="m", gpu_memory_utilization=0.9)

    def init_env(self) -> dict[str, str | None]:
        return self.env_at_init


@kr.gpu_capped
class DecoratedActor(_Probe):
    pass


class MixinActor(kr.GpuCapped, _Probe):
    pass


class PlainActor(_Probe):
    """No decorator, no call: only the runtime_env's setup hook and import hooks."""


def capped_task() -> dict[str, Any]:
    return kr.cap_gpu_memory().as_dict()


def plain_task_importing_jax() -> dict[str, Any]:
    probe = jax_probe()
    probe["cap"] = kr.current_cap().as_dict()
    return probe
