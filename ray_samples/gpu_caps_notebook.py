# %% [markdown]
# # GPU memory caps that match the pod's GPU fraction
#
# In a kai-ray pod with `gpu-fraction: "0.5"` the binder sets `GPU_PORTION=0.50` and
# `NVIDIA_VISIBLE_DEVICES=<GPU UUID>`; Ray (started with `num-gpus: "1"`, see
# raycluster-gpu-fraction-capped.yaml) advertises one GPU. The helper caps every Ray task or actor
# at its share of the pod's half: `num_gpus=0.5` → a quarter of the device.
#
# Runs anywhere, GPU or not: `python ray_samples/gpu_caps_notebook.py` (or cell by cell in a
# notebook). Off-cluster it fakes the pod env below and lets Ray pretend to have 4 GPUs.

# %%
import os

import ray

import kai_ray.ray as kr

if "GPU_PORTION" not in os.environ:  # not in a kai-ray pod: pretend to be one
    os.environ["GPU_PORTION"] = "0.50"
    os.environ.setdefault("KAI_RAY_GPU_MEMORY_MIB", "16384")  # the pretend device size
    os.environ.setdefault("KAI_RAY_NVML", "off")  # pretend 16 GiB devices even on a GPU
    FAKE_GPUS = {"num_gpus": 4}
else:
    FAKE_GPUS = {}

# %% [markdown]
# ## Way 1: `runtime_env` — every worker is capped, no code change in tasks or actors
# The setup hook arms import hooks in each worker; the cap lands when a task or actor imports
# JAX / PyTorch / TensorFlow / CuPy (the hook itself runs before Ray assigns GPUs).

# %%
ray.init(runtime_env=kr.runtime_env(), include_dashboard=False, **FAKE_GPUS)


@ray.remote(num_gpus=0.5, num_cpus=0)
def train_step() -> str:
    import jax  # the cap was set just before this import (XLA_CLIENT_MEM_FRACTION)

    del jax
    return kr.describe()


print(ray.get(train_step.remote()))

# %% [markdown]
# ## Way 2: a decorator (or the `kr.GpuCapped` mixin) on an actor class
# The cap is applied before `__init__` runs, so the model you load there is already capped.
# The same class works as a Ray Serve deployment (see gpu_caps_serve.py).


# %%
@ray.remote(num_gpus=0.25, num_cpus=0)
@kr.gpu_capped
class Model:
    def __init__(self) -> None:
        self.cap = kr.current_cap()

    def cap_bytes(self) -> int | None:
        return self.cap.devices[0]["cap_bytes"] if self.cap.devices else None

    def vllm_kwargs(self) -> dict:
        # for vllm.LLM(**...) created in this actor: its whole-process budget
        return kr.vllm_engine_kwargs(model="my-model")


model = Model.remote()
print("actor cap bytes:", ray.get(model.cap_bytes.remote()))
print("vLLM kwargs:", ray.get(model.vllm_kwargs.remote()))

# %% [markdown]
# ## Way 3: call the helper at the top of a task


# %%
@ray.remote(num_gpus=1, num_cpus=0)
def whole_ray_gpu() -> dict:
    report = kr.cap_gpu_memory()
    return {"capped": report.capped_frameworks, "devices": report.devices}


print(ray.get(whole_ray_gpu.remote()))

# %% [markdown]
# ## In the notebook (the driver) itself
# The driver holds the pod's full portion of every device it sees.

# %%
kr.cap_gpu_memory()
kr.describe()
ray.shutdown()
