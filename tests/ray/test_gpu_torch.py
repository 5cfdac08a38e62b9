"""On a real NVIDIA GPU: PyTorch allocations past the helper's cap fail, within it succeed."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

PROBE = """
    import json
    import kai_ray.ray as kr
    kr.cap_gpu_memory()              # before torch: the import hook takes over
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False}))
        raise SystemExit(0)
    torch.cuda.init()                # the queued cap runs inside torch's CUDA init
    rec = kr.current_cap().frameworks["torch"]
    cap = int(rec["settings"]["cap_bytes[0]"])
    total = torch.cuda.get_device_properties(0).total_memory
    x = torch.empty(int(cap * 0.8), dtype=torch.uint8, device="cuda")
    within = True
    del x
    torch.cuda.empty_cache()
    try:
        y = torch.empty(int(cap * 1.1), dtype=torch.uint8, device="cuda")
        beyond = True
        del y
    except torch.cuda.OutOfMemoryError:
        beyond = False
    print(json.dumps({"cuda": True, "rec": rec, "cap": cap, "total": total,
                      "within": within, "beyond": beyond,
                      "fraction": torch.cuda.get_per_process_memory_fraction(0)}))
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_allocation_past_the_cap_fails_and_within_succeeds():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PORTION", "KAI_RAY_"))}
    env.update({"GPU_PORTION": "0.5",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["cuda"]:
        pytest.skip("no CUDA device")
    assert out["rec"]["status"] == "applied"
    # half the device minus the 256 MiB CUDA-context headroom
    assert out["cap"] == out["total"] // 2 - (256 << 20)
    assert out["fraction"] == pytest.approx(out["cap"] / out["total"], abs=1e-6)
    assert out["within"] is True
    assert out["beyond"] is False
