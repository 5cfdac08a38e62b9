"""Real Ray on the CPU: ray.init(num_gpus=4) assigns GPU ids without hardware. Each actor, task
or Serve replica computes and applies its own cap from the pod env it sees (per-actor runtime_env
env_vars play the binder's part)."""

import importlib.util

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

MIB = 1 << 20
# KAI_RAY_NVML=off: the configured 16384 MiB device, even on a machine with a real GPU
FRACTION_POD = {"GPU_PORTION": "0.50", "KAI_RAY_GPU_MEMORY_MIB": "16384", "KAI_RAY_NVML": "off"}


def start(ray_session, cls, g, env):
    import ray_probes

    actor = ray_session.remote(getattr(ray_probes, cls))
    return actor.options(num_gpus=g, num_cpus=0, runtime_env={"env_vars": env}).remote()


# (num_gpus, cap MiB, JAX fraction string): share = g × 0.5 of 16384 MiB, minus 256 MiB headroom
EXPECTED = [(0.25, 2048 - 256, "0.1093"), (0.5, 4096 - 256, "0.2343"), (1, 8192 - 256, "0.4843")]


@pytest.mark.parametrize(("g", "cap_mib", "jax_value"), EXPECTED)
def test_decorated_actor_caps_its_share(ray_session, g, cap_mib, jax_value):
    a = start(ray_session, "DecoratedActor", g, FRACTION_POD)
    report = ray_session.get(a.report.remote())
    assert report["active"] and report["mode"] == "fraction"
    assert report["process"].startswith("actor ")
    (dev,) = report["devices"]
    assert dev["share"] == pytest.approx(g * 0.5)
    assert dev["cap_bytes"] == cap_mib * MIB
    assert dev["total_source"] == "KAI_RAY_GPU_MEMORY_MIB"
    # frameworks: JAX set by env, the absent ones say so
    jax_rec = report["frameworks"]["jax"]
    assert jax_rec["status"] == "applied"
    assert jax_rec["settings"] == {"XLA_CLIENT_MEM_FRACTION": jax_value}
    assert report["frameworks"]["cupy"]["status"] == "not-installed"
    assert "CuPy is not installed" in report["frameworks"]["cupy"]["detail"]
    assert report["frameworks"]["torch"]["status"] in ("not-installed", "no-gpu")
    assert "jax" in report["capped_frameworks"]
    # the env var was there before the actor's own code ran, and JAX really reads it
    assert ray_session.get(a.init_env.remote())["XLA_CLIENT_MEM_FRACTION"] == jax_value
    probe = ray_session.get(a.jax.remote())
    assert probe["env_before_import"]["XLA_CLIENT_MEM_FRACTION"] == jax_value
    assert probe["env_before_import"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None
    assert probe["plugin_options"]["memory_fraction"] == pytest.approx(float(jax_value))
    assert probe["backends_initialised"] is False
    ray_session.kill(a)


def test_two_fractional_actors_share_one_ray_gpu(ray_session):
    a = start(ray_session, "MixinActor", 0.25, FRACTION_POD)
    b = start(ray_session, "MixinActor", 0.5, FRACTION_POD)
    ra, rb = ray_session.get([a.report.remote(), b.report.remote()])
    assert ra["devices"][0]["ray_gpu_id"] == rb["devices"][0]["ray_gpu_id"]
    assert ra["devices"][0]["cap_bytes"] + rb["devices"][0]["cap_bytes"] <= 8192 * MIB
    assert ra["frameworks"]["jax"]["settings"]["XLA_CLIENT_MEM_FRACTION"] == "0.1093"
    ray_session.kill(a)
    ray_session.kill(b)


def test_runtime_env_alone_caps_jax_imported_in_an_actor(ray_session):
    a = start(ray_session, "PlainActor", 0.5, FRACTION_POD)
    assert ray_session.get(a.init_env.remote())["XLA_CLIENT_MEM_FRACTION"] is None
    probe = ray_session.get(a.jax.remote())
    assert probe["env_before_import"]["XLA_CLIENT_MEM_FRACTION"] is None
    assert probe["env_after_import"]["XLA_CLIENT_MEM_FRACTION"] == "0.2343"
    assert probe["plugin_options"]["memory_fraction"] == pytest.approx(0.2343)
    report = ray_session.get(a.report.remote())
    assert report["frameworks"]["jax"]["detail"].startswith(
        "set XLA_CLIENT_MEM_FRACTION=0.2343 before JAX was imported")
    # the first hook that fired applied the whole cap, not only JAX's part
    assert {"cupy", "mps", "torch", "tensorflow"} <= set(report["frameworks"])
    assert report["notes"] == []
    ray_session.kill(a)


def test_runtime_env_alone_caps_a_task(ray_session):
    import ray_probes

    task = ray_session.remote(ray_probes.plain_task_importing_jax)
    out = ray_session.get(task.options(num_gpus=0.5, num_cpus=0,
                                       runtime_env={"env_vars": FRACTION_POD}).remote())
    assert out["plugin_options"]["memory_fraction"] == pytest.approx(0.2343)
    assert out["cap"]["process"].startswith("task ")
    assert out["cap"]["devices"][0]["cap_bytes"] == (4096 - 256) * MIB


def test_function_called_inside_a_task(ray_session):
    import ray_probes

    task = ray_session.remote(ray_probes.capped_task)
    out = ray_session.get(task.options(num_gpus=1, num_cpus=0,
                                       runtime_env={"env_vars": FRACTION_POD}).remote())
    assert out["active"] and out["devices"][0]["cap_bytes"] == (8192 - 256) * MIB
    none = ray_session.get(task.options(num_gpus=0, num_cpus=0,
                                        runtime_env={"env_vars": FRACTION_POD}).remote())
    assert not none["active"] and "Ray assigned no GPU" in none["why"][-1]


def test_gpu_memory_pod_gives_a_mib_cap(ray_session):
    env = {"GPU_PORTION": "0.37", "KAI_RAY_GPU_MEMORY_LIMIT_MIB": "6000",
           "KAI_RAY_GPU_MEMORY_MIB": "16384", "KAI_RAY_NVML": "off"}
    a = start(ray_session, "DecoratedActor", 0.5, env)
    report = ray_session.get(a.report.remote())
    assert report["mode"] == "memory"
    dev = report["devices"][0]
    assert dev["limit_bytes"] == 3000 * MIB and dev["cap_bytes"] == 2744 * MIB
    assert report["frameworks"]["jax"]["settings"] == {"XLA_CLIENT_MEM_FRACTION": "0.1674"}
    # vLLM budgets its whole process: the entitlement, headroom not subtracted
    kwargs = ray_session.get(a.vllm_kwargs.remote())
    assert kwargs == {"model": "m", "gpu_memory_utilization": 0.1831}
    text = ray_session.get(a.describe.remote())
    assert "memory cap" in text and "2744 MiB of 16384 MiB" in text
    ray_session.kill(a)


def test_whole_gpu_pod_is_not_capped(ray_session):
    a = start(ray_session, "DecoratedActor", 0.5, {"KAI_RAY_GPU_MEMORY_MIB": "16384"})
    report = ray_session.get(a.report.remote())
    assert not report["active"] and report["frameworks"] == {}
    assert ray_session.get(a.init_env.remote())["XLA_CLIENT_MEM_FRACTION"] is None
    ray_session.kill(a)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPU_PORTION": "0"}, "GPU_PORTION='0': a GPU portion must be > 0 and <= 1"),
        ({"GPU_PORTION": "1.5"}, "GPU_PORTION='1.5': a GPU portion must be > 0 and <= 1"),
        ({"GPU_PORTION": "half"}, "GPU_PORTION='half': not a number"),
        ({"KAI_RAY_GPU_MEMORY_LIMIT_MIB": "6GB"},
         "KAI_RAY_GPU_MEMORY_LIMIT_MIB='6GB': not an integer number of MiB"),
    ],
)
def test_bad_env_fails_the_actor_with_the_variable_named(ray_session, env, message):
    a = start(ray_session, "DecoratedActor", 0.5, env)
    with pytest.raises(Exception) as e:
        ray_session.get(a.report.remote())
    assert message in str(e.value)


def test_bad_env_is_not_ignored_with_runtime_env_alone(ray_session):
    # the setup hook only warns (a failing hook kills the worker anonymously); the framework
    # import inside the actor then fails with the variable named
    a = start(ray_session, "PlainActor", 0.5, {"GPU_PORTION": "2"})
    with pytest.raises(Exception) as e:
        ray_session.get(a.jax.remote())
    assert "GPU_PORTION='2': a GPU portion must be > 0 and <= 1" in str(e.value)
    ray_session.kill(a)


def test_bad_env_fails_a_task_that_calls_the_helper(ray_session):
    import ray_probes

    task = ray_session.remote(ray_probes.capped_task)
    with pytest.raises(Exception) as e:
        ray_session.get(task.options(num_gpus=0.5, num_cpus=0,
                                     runtime_env={"env_vars": {"GPU_PORTION": "0"}}).remote())
    assert "GPU_PORTION='0'" in str(e.value)


def test_driver_gets_the_pods_portion(ray_session, monkeypatch):
    from kai_ray.ray import process

    monkeypatch.setattr(process, "_state", process._State())
    monkeypatch.setenv("GPU_PORTION", "0.5")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b")
    monkeypatch.setenv("KAI_RAY_GPU_MEMORY_MIB", "16384")
    monkeypatch.setenv("KAI_RAY_NVML", "off")
    report = process.current_cap()  # reports, applies nothing in a driver
    assert report.process == "Ray driver"
    assert [d["uuid"] for d in report.devices] == ["GPU-a", "GPU-b"]
    assert [d["cap_bytes"] for d in report.devices] == [(8192 - 256) * MIB] * 2
    assert report.frameworks == {} and "not applied" in report.notes[0]


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                    reason="ray[serve] is not installed")
def test_serve_replica_is_capped(ray_session):
    from ray import serve

    import kai_ray.ray as kr

    @serve.deployment(ray_actor_options={
        "num_gpus": 0.5, "num_cpus": 0,
        "runtime_env": {"env_vars": FRACTION_POD}})
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
