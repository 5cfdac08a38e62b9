# %% [markdown]
# # More GPU work than the cluster has: Ray's autoscaler asks, kai-ray places what fits
#
# A Ray job for raycluster-gpu-autoscaler.yaml: TASKS one-GPU tasks (default 3), each holding
# its GPU for HOLD_S seconds (default 30). Ray's autoscaler raises the worker group's replicas
# to cover them; kai-ray places the workers that fit; a task without a worker waits until a GPU
# is free again, so the job ends whatever the number of GPUs.
#
#     ray job submit --address http://<head>:8265 --working-dir ray_samples \
#         -- python3 gpu_autoscale_job.py
#
# Off-cluster (`python ray_samples/gpu_autoscale_job.py`) it starts a local Ray that pretends to
# have 2 GPUs. Prints one line `RESULT <json>`: per task, the pod (host) it ran on, its GPU, and
# when it started and ended (seconds since the epoch).

# %%
import json
import os
import socket
import time

import ray

TASKS = int(os.environ.get("TASKS", "3"))
HOLD_S = float(os.environ.get("HOLD_S", "30"))

if os.environ.get("RAY_ADDRESS"):  # set for a job's entrypoint by Ray's job supervisor
    ray.init()
else:
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False)


# %%
@ray.remote(num_gpus=1)
def hold_gpu(index: int) -> dict:
    start = time.time()
    time.sleep(HOLD_S)  # stands for GPU work: the fake GPUs of the test node run nothing
    return {"task": index, "host": socket.gethostname(), "ray_gpu_ids": ray.get_gpu_ids(),
            "device": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "start": start,
            "end": time.time()}


# %%
results = ray.get([hold_gpu.remote(i) for i in range(TASKS)])
print("RESULT " + json.dumps(results), flush=True)
