"""The Go harness that runs KAI-Scheduler's own actions (benchmarks/kai_go): building it, and
writing a kai_ray `Snapshot` in its JSON schema (`cluster.go`).

KAI's test utilities build the session, so only what they express maps: homogeneous jobs, two
queue levels with GPU quotas (CPU and memory unlimited), preemptibility that follows priority,
pods pending, running or releasing. Anything else raises ValueError naming the object and field.
KAI's test departments (top-level queues) weigh their over-quota share by their GPU quota,
whatever the snapshot's weight says.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

from kai_ray.core.model import Job, PodStatus, Snapshot
from kai_ray.testing.binaries import repo_root


class HarnessMissing(RuntimeError):
    """The harness cannot be built here (no source checkout, or no Go)."""


def harness_dir() -> pathlib.Path:
    root = repo_root()
    if root is None or not (root / "benchmarks" / "kai_go" / "go.mod").is_file():
        raise HarnessMissing("benchmarks/kai_go is not next to this package: run from a checkout")
    return root / "benchmarks" / "kai_go"


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The cluster in the harness's schema; raises ValueError naming what KAI's test utilities
    cannot express."""
    priorities = {q.priority for q in snap.queues}
    if len(priorities) > 1:
        raise ValueError(f"queues: different priorities {sorted(priorities)} (not mapped)")
    queues = []
    for q in sorted(snap.queues, key=lambda q: q.created):
        for field in ("cpu", "memory"):
            quota = getattr(q, field)
            if quota.quota != -1 or quota.limit != -1:
                raise ValueError(f"queue {q.name}: {field} quota/limit must be unlimited (-1)")
        if q.gpu.limit == 0:
            raise ValueError(f"queue {q.name}: gpu.limit 0 means unlimited in KAI's test utilities")
        queues.append({"name": q.name, "parent": q.parent or "", "gpu_quota": q.gpu.quota,
                       "gpu_limit": q.gpu.limit, "gpu_over_quota_weight": q.gpu.weight})
    return {
        "nodes": [{"name": n.name, "cpu_m": n.cpu_m, "memory": n.memory, "gpus": n.gpus,
                   "gpu_memory_mib": n.gpu_memory_mib, "max_pods": n.max_pods}
                  for n in snap.nodes],
        "queues": queues,
        "jobs": [job_json(j) for j in snap.jobs],
    }


_MAPPED = (PodStatus.PENDING, PodStatus.RUNNING, PodStatus.RELEASING)


def job_json(job: Job) -> dict[str, Any]:
    req = job.pods[0].request
    if job.subgroups or job.stale_since is not None:
        raise ValueError(f"job {job.name}: subgroups / stale_since are not mapped")
    if job.preemptible is not None and job.preemptible != (job.priority < 100):
        raise ValueError(f"job {job.name}: preemptible must follow priority (< 100) in KAI")
    if req.gpu_memory_mib or req.fraction_devices != 1:
        raise ValueError(f"job {job.name}: request.gpu_memory_mib / fraction_devices not mapped")
    pods = []
    for pod in job.pods:
        if pod.request != req:
            raise ValueError(f"job {job.name} pod {pod.name}: request differs from the job's "
                             "first pod (KAI's test jobs are homogeneous)")
        if (pod.node_selector or pod.tolerations or pod.node_affinity is not None
                or pod.replica or pod.task_priority is not None):
            raise ValueError(f"job {job.name} pod {pod.name}: placement constraints not mapped")
        if pod.status not in _MAPPED:
            raise ValueError(f"job {job.name} pod {pod.name}: status {pod.status} not mapped")
        pods.append({"name": pod.name, "status": str(pod.status), "node": pod.node or "",
                     "gpu_groups": list(pod.gpu_groups)})
    return {"name": job.name, "queue": job.queue, "priority": job.priority,
            "min_member": job.min_member, "created": job.created,
            "request": {"cpu_m": req.cpu_m, "memory": req.memory, "gpus": req.gpus,
                        "gpu_fraction_milli": req.gpu_fraction_milli},
            "pods": pods}


def cache_dir() -> pathlib.Path:
    home = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return home / "kai-ray"


def build_harness(kai_source: pathlib.Path | None = None) -> pathlib.Path:
    """`go test -c` of the harness into the user cache; `kai_source` builds it against a
    KAI-scheduler source tree (a `replace` directive in a copy of the harness)."""
    go = shutil.which("go")
    if go is None:
        raise HarnessMissing("`go` is not on PATH; the KAI harness needs Go >= 1.24 "
                             "(https://go.dev/dl) and the Go module proxy")
    source = harness_dir()
    # one binary per checkout: two worktrees building at once must not overwrite each other's
    tag = hashlib.sha1(str(source).encode()).hexdigest()[:8]
    if kai_source is not None:
        # and one per KAI tree: the fuzzer builds several patched KAIs (kai_variants), each
        # in its own copy of the harness, kept so that Go's build cache serves a rebuild
        tag += "-" + hashlib.sha1(str(kai_source.resolve()).encode()).hexdigest()[:8]
    binary = cache_dir() / f"kai_cycle-{tag}.test"
    binary.parent.mkdir(parents=True, exist_ok=True)
    if kai_source is not None:
        replaced = binary.parent / f"kai_go_replaced-{tag}"
        shutil.rmtree(replaced, ignore_errors=True)
        shutil.copytree(source, replaced)
        with open(replaced / "go.mod", "a") as mod:
            mod.write(f"\nreplace github.com/NVIDIA/KAI-scheduler => {kai_source.resolve()}\n")
        source = replaced
    print(f"building the KAI harness{f' against {kai_source}' if kai_source else ''} (go test "
          "-c; the first build downloads and compiles KAI-scheduler and Kubernetes: several "
          "minutes)...", file=sys.stderr)
    start = time.perf_counter()
    done = subprocess.run(["nice", "-n", "10", go, "test", "-c", "-o", str(binary), "."],
                          cwd=source, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise HarnessMissing(f"building {source} failed:\n{done.stderr}")
    print(f"  built in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return binary


def kai_version() -> str:
    for line in (harness_dir() / "go.mod").read_text().splitlines():
        if "github.com/NVIDIA/KAI-scheduler " in line:
            return line.split("//")[0].split()[-1]
    return "?"
