"""Ray Serve: a decorated deployment class gets the cap of its replica's num_gpus share."""

import importlib.util

import pytest

pytestmark = pytest.mark.ray

MIB = 1 << 20


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                    reason="ray[serve] is not installed")
def test_serve_replica_is_capped(ray_session):
    from ray import serve

    import kai_ray.ray as kr

    @serve.deployment(ray_actor_options={
        "num_gpus": 0.5, "num_cpus": 0,
        "runtime_env": {"env_vars": {"GPU_PORTION": "0.5", "KAI_RAY_GPU_MEMORY_MIB": "16384"}}})
    @kr.gpu_capped
    class Model:
        def __call__(self) -> dict:
            return kr.current_cap().as_dict()

    serve.start(proxy_location="Disabled")
    try:
        handle = serve.run(Model.bind(), name="capped", route_prefix=None)
        report = handle.remote().result(timeout_s=120)
    finally:
        serve.shutdown()
    assert report["active"] and report["process"].startswith("actor ")
    assert report["devices"][0]["cap_bytes"] == (4096 - 256) * MIB
    assert report["frameworks"]["jax"]["settings"] == {"XLA_CLIENT_MEM_FRACTION": "0.2343"}
