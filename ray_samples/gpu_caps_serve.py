# %% [markdown]
# # Ray Serve: a capped deployment
#
# Each replica with `num_gpus: 0.5` in a `gpu-fraction: "0.5"` pod may use a quarter of the
# device. `serve run ray_samples.gpu_caps_serve:app` on the cluster, or
# `python ray_samples/gpu_caps_serve.py` anywhere (fakes the pod env and 4 GPUs off-cluster).

# %%
import os

import ray
from ray import serve

import kai_ray.ray as kr


@serve.deployment(ray_actor_options={"num_gpus": 0.5, "num_cpus": 0})
@kr.gpu_capped
class Generator:
    def __init__(self) -> None:
        # build the model here: the cap is already in place (PyTorch, JAX, TF, CuPy), or pass
        # kr.vllm_engine_kwargs(model=...) to vllm.LLM / AsyncEngineArgs
        self.engine_kwargs = kr.vllm_engine_kwargs(model="my-model")

    def __call__(self) -> dict:
        report = kr.current_cap()
        return {"process": report.process, "devices": report.devices,
                "frameworks": report.frameworks, "vllm": self.engine_kwargs}


app = Generator.bind()

# %%
if __name__ == "__main__":
    fake = {}
    if "GPU_PORTION" not in os.environ:
        os.environ["GPU_PORTION"] = "0.50"
        os.environ.setdefault("KAI_RAY_GPU_MEMORY_MIB", "16384")
        os.environ.setdefault("KAI_RAY_NVML", "off")  # pretend 16 GiB devices even on a GPU
        fake = {"num_gpus": 4}
    ray.init(runtime_env=kr.runtime_env(), include_dashboard=False, **fake)
    serve.start(proxy_location="Disabled")
    handle = serve.run(app, name="capped", route_prefix=None)
    print(handle.remote().result(timeout_s=120))
    serve.shutdown()
    ray.shutdown()
