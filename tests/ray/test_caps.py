"""The cap arithmetic: pod portion × Ray num_gpus share − headroom (pure, no Ray)."""

import pytest

from kai_ray.ray.caps import MIB, RayShare, compute_cap
from kai_ray.ray.gpu_env import GpuEnvError, parse_pod_env

GIB16 = 16384 * MIB


def actor(g: float, *ids: str) -> RayShare:
    return RayShare(True, g, ids, "actor test")


def cap_for(env, share, totals=None, source="nvml", **kw):
    return compute_cap(parse_pod_env(env), share, totals or {}, source, **kw)


@pytest.mark.parametrize(
    ("g", "ids", "share", "cap_mib"),
    [(0.25, ("0",), 0.125, 2048 - 256), (0.5, ("0",), 0.25, 4096 - 256),
     (1, ("1",), 0.5, 8192 - 256)],
)
def test_fraction_pod_actor_shares(g, ids, share, cap_mib):
    cap = cap_for({"GPU_PORTION": "0.5"}, actor(g, *ids), {0: GIB16, 1: GIB16})
    assert cap.active and cap.mode == "fraction"
    (dev,) = cap.devices
    assert dev.share == share
    assert dev.cap_bytes == cap_mib * MIB
    assert dev.fraction == pytest.approx(cap_mib / 16384)
    assert dev.ray_gpu_id == ids[0] and dev.cuda_index == 0


def test_two_whole_ray_gpus_each_get_the_pod_portion():
    env = {"GPU_PORTION": "0.5", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    cap = cap_for(env, actor(2, "0", "1"), {0: GIB16, 1: 2 * GIB16})
    assert [d.uuid for d in cap.devices] == ["GPU-a", "GPU-b"]
    assert [d.cuda_index for d in cap.devices] == [0, 1]
    assert [d.cap_bytes for d in cap.devices] == [(8192 - 256) * MIB, (16384 - 256) * MIB]
    assert cap.min_fraction() == pytest.approx((8192 - 256) / 16384)


def test_memory_pod_splits_the_mib_limit():
    env = {"GPU_PORTION": "0.37", "KAI_RAY_GPU_MEMORY_LIMIT_MIB": "6000"}
    cap = cap_for(env, actor(0.5, "0"), {0: GIB16})
    (dev,) = cap.devices
    assert cap.mode == "memory"
    assert dev.limit_bytes == 3000 * MIB and dev.cap_bytes == 2744 * MIB
    assert dev.share == pytest.approx(3000 / 16384)


def test_memory_pod_without_device_size_still_has_bytes():
    cap = cap_for({"KAI_RAY_GPU_MEMORY_LIMIT_MIB": "6000"}, actor(1, "0"), {}, None)
    (dev,) = cap.devices
    assert dev.cap_bytes == 5744 * MIB and dev.fraction is None and dev.share is None
    # a framework that knows the size resolves it itself
    fraction, cap_bytes = dev.resolve(GIB16)
    assert cap_bytes == 5744 * MIB and fraction == pytest.approx(5744 / 16384)


def test_fraction_pod_without_device_size_keeps_the_share():
    cap = cap_for({"GPU_PORTION": "0.5"}, actor(0.5, "0"), {}, None)
    (dev,) = cap.devices
    assert dev.share == 0.25 and dev.cap_bytes is None and dev.fraction is None
    assert cap.min_share() == 0.25 and cap.min_fraction() is None
    assert dev.resolve(GIB16) == ((4096 - 256) / 16384, (4096 - 256) * MIB)
    assert any("device memory unknown" in w for w in cap.why)


def test_whole_gpu_pod_gets_no_cap_unless_asked():
    cap = cap_for({}, actor(0.5, "0"), {0: GIB16})
    assert not cap.active and "whole-GPU pod" in cap.why[0]
    forced = cap_for({"KAI_RAY_GPU_CAP": "on"}, actor(0.5, "0"), {0: GIB16})
    assert forced.active and forced.mode == "forced"
    assert forced.devices[0].cap_bytes == (8192 - 256) * MIB
    assert cap_for({}, actor(0.5, "0"), {0: GIB16}, force=True).active


def test_cap_off_disables():
    assert not cap_for({"GPU_PORTION": "0.5", "KAI_RAY_GPU_CAP": "off"}, actor(1, "0")).active


def test_no_ray_gpu_means_no_cap():
    cap = cap_for({"GPU_PORTION": "0.5"}, actor(0))
    assert not cap.active and "no GPU" in cap.why[-1]


def test_driver_gets_the_full_portion_on_every_pod_device():
    env = {"GPU_PORTION": "0.5", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    cap = cap_for(env, RayShare(False, 0, (), "Ray driver"), {0: GIB16, 1: GIB16})
    assert [d.share for d in cap.devices] == [0.5, 0.5]
    assert [d.ray_gpu_id for d in cap.devices] == [None, None]


def test_headroom_larger_than_the_share_names_the_variable():
    env = {"GPU_PORTION": "0.1", "KAI_RAY_GPU_HEADROOM_MIB": "2000"}
    with pytest.raises(GpuEnvError) as e:
        cap_for(env, actor(0.5, "0"), {0: GIB16})
    assert e.value.variable == "KAI_RAY_GPU_HEADROOM_MIB"


def test_ray_gpu_beyond_the_pods_devices_is_explained():
    env = {"GPU_PORTION": "0.5", "NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    cap = cap_for(env, actor(1, "3"), {0: GIB16})
    assert cap.devices[0].uuid is None
    assert any("no entry in NVIDIA_VISIBLE_DEVICES" in w for w in cap.why)


def test_uuid_ray_ids_map_to_the_pod_device():
    env = {"GPU_PORTION": "0.5", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    cap = cap_for(env, actor(1, "GPU-b"), {0: GIB16, 1: 2 * GIB16})
    assert cap.devices[0].pod_index == 1 and cap.devices[0].total_bytes == 2 * GIB16
