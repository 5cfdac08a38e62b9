import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def real_ray():
    """The installed ray package (tests/ray must not pass for it as a namespace package)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install -e '.[test]')")
    import ray

    if not hasattr(ray, "init"):
        pytest.skip("ray is not installed (pip install -e '.[test]')")
    return ray


def worker_pythonpath() -> str:
    """Workers must import this checkout's kai_ray and the probes, whatever is installed."""
    parts = [str(ROOT), str(HERE)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray per test module: 4 fake GPUs, 1 CPU, no dashboard; shut down after."""
    ray = real_ray()
    import kai_ray.ray as kr

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_gpus=4,
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=kr.runtime_env({"env_vars": {"PYTHONPATH": worker_pythonpath()}}),
    )
    try:
        yield ray
    finally:
        ray.shutdown()
