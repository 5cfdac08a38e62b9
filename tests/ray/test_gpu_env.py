"""Parsing the pod's GPU env: every bad value names its variable."""

import pytest

from kai_ray.ray.gpu_env import (
    DEFAULT_HEADROOM_MIB,
    GpuEnvError,
    parse_devices,
    parse_pod_env,
)


def test_fraction_pod():
    pod = parse_pod_env({"GPU_PORTION": "0.50", "NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    assert pod.portion == 0.5 and pod.portion_var == "GPU_PORTION"
    assert pod.devices == ("GPU-a",)
    assert pod.fractional
    assert pod.headroom_mib == DEFAULT_HEADROOM_MIB


def test_whole_gpu_pod_is_not_fractional():
    assert not parse_pod_env({}).fractional
    assert not parse_pod_env({"GPU_PORTION": "1"}).fractional


def test_memory_pod_is_fractional_even_without_portion():
    pod = parse_pod_env({"KAI_RAY_GPU_MEMORY_LIMIT_MIB": "4000"})
    assert pod.memory_limit_mib == 4000 and pod.fractional


def test_runai_num_of_gpus_is_a_fallback_portion_but_whole_counts_are_ignored():
    assert parse_pod_env({"RUNAI_NUM_OF_GPUS": "0.25"}).portion == 0.25
    assert parse_pod_env({"RUNAI_NUM_OF_GPUS": "2"}).portion is None


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        ({"GPU_PORTION": "0"}, "GPU_PORTION", "must be > 0 and <= 1"),
        ({"GPU_PORTION": "1.5"}, "GPU_PORTION", "must be > 0 and <= 1"),
        ({"GPU_PORTION": "-0.5"}, "GPU_PORTION", "must be > 0 and <= 1"),
        ({"GPU_PORTION": "half"}, "GPU_PORTION", "not a number"),
        ({"GPU_PORTION": "nan"}, "GPU_PORTION", "not a finite number"),
        ({"RUNAI_NUM_OF_GPUS": "0"}, "RUNAI_NUM_OF_GPUS", "must be > 0"),
        ({"KAI_RAY_GPU_MEMORY_LIMIT_MIB": "4GiB"}, "KAI_RAY_GPU_MEMORY_LIMIT_MIB", "integer"),
        ({"KAI_RAY_GPU_MEMORY_LIMIT_MIB": "0"}, "KAI_RAY_GPU_MEMORY_LIMIT_MIB", "> 0"),
        ({"KAI_RAY_GPU_MEMORY_MIB": "1.5"}, "KAI_RAY_GPU_MEMORY_MIB", "integer"),
        ({"KAI_RAY_GPU_HEADROOM_MIB": "-1"}, "KAI_RAY_GPU_HEADROOM_MIB", ">= 0"),
        ({"KAI_RAY_GPU_CAP": "maybe"}, "KAI_RAY_GPU_CAP", "one of auto, on, off"),
        ({"KAI_RAY_MPS_LIMIT": "yes"}, "KAI_RAY_MPS_LIMIT", "one of auto, on, off"),
        ({"KAI_RAY_NVML": "on"}, "KAI_RAY_NVML", "one of auto, off"),
    ],
)
def test_bad_values_name_the_variable(env, variable, words):
    with pytest.raises(GpuEnvError) as e:
        parse_pod_env(env)
    assert e.value.variable == variable
    assert str(e.value).startswith(f"{variable}={env[variable]!r}")
    assert words in str(e.value)


def test_headroom_zero_is_allowed():
    assert parse_pod_env({"KAI_RAY_GPU_HEADROOM_MIB": "0"}).headroom_mib == 0


@pytest.mark.parametrize(
    ("raw", "devices"),
    [(None, ()), ("all", ()), ("void", ()), ("", ()), ("GPU-a, GPU-b", ("GPU-a", "GPU-b"))],
)
def test_visible_devices(raw, devices):
    assert parse_devices(raw) == devices
