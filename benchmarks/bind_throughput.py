"""Pods bound per second, end to end, on the real local control plane with KWOK nodes:
kai-ray (`kai-ray run`) against the stock kube-scheduler on the same plane and workload.

    python benchmarks/bind_throughput.py --nodes 1000 --single 5000 --gangs 500 --gang-size 8
    python benchmarks/bind_throughput.py --qps 50   # both schedulers at kube-scheduler's default

Each run starts a fresh plane, creates the nodes, creates every pod (16 client threads) while no
scheduler runs, then starts the scheduler: the clock starts there, so pod creation does not limit
the rate. Reported: pods bound per second from the scheduler's start to the last pod bound
(`e2e`, includes kai-ray's start-up: cache sync and PodGroup creation for the bare pods), and from
the first bind to the last (`bind`). kai-ray's pods are in a queue
and gangs are PodGroups (min = gang size); kube-scheduler gets the same pods one by one (it has
no gangs). Both schedulers get the same client rate limit: `--kube-api-qps=QPS` and
`--kube-api-burst=2*QPS` (kube-scheduler's default ratio, 50/100).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from kubernetes import client

from kai_ray.k8s.cache import Informer
from kai_ray.testing import binaries
from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready
from kai_ray.testing.plane import ControlPlane
from kai_ray.testing.scheduler_process import KaiRayProcess

NS = "bench"


def _pod(name: str, scheduler: str, group: str | None, gpus: int) -> dict:
    meta: dict = {"name": name, "labels": {"kai.scheduler/queue": "bench"}}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    resources: dict = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "example.invalid/x:1", "resources": resources}]}}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_process(plane: ControlPlane, proc: KaiRayProcess | None) -> dict[str, float]:
    pids = {name: c.pid for name, c in plane.components.items()}
    if proc is not None and proc.proc is not None:
        pids["kai-ray"] = proc.proc.pid
    out = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    out["benchmark"] = sum(os.times()[:2])
    return out


def run(scheduler: str, args: argparse.Namespace) -> dict:
    plane = ControlPlane()
    plane.start()
    proc = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        api = plane.api_client()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        t = time.monotonic()
        with ThreadPoolExecutor(16) as pool:  # 1,000 creates one by one take minutes
            names = list(pool.map(lambda i: create_gpu_nodes(api, 1, 8, start=i)[0],
                                  range(args.nodes)))
        wait_nodes_ready(api, names, timeout=600)
        print(f"  {args.nodes} nodes ready in {time.monotonic() - t:.1f}s", file=sys.stderr)
        core.create_namespace({"metadata": {"name": NS}})
        plane.wait_service_account(NS)
        if scheduler == "kai":
            open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
            custom.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", {
                "apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                "metadata": {"name": "bench"},
                "spec": {"resources": {"gpu": open_, "cpu": open_, "memory": open_}}})
        name = "kai-scheduler" if scheduler == "kai" else "default-scheduler"
        pods = [(f"single-{i}", None) for i in range(args.single)]
        for g in range(args.gangs):
            group = f"gang-{g}" if scheduler == "kai" else None
            if group:
                custom.create_namespaced_custom_object(
                    "scheduling.run.ai", "v2alpha2", NS, "podgroups",
                    {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                     "metadata": {"name": group},
                     "spec": {"queue": "bench", "minMember": args.gang_size}})
            pods += [(f"gang-{g}-{k}", group) for k in range(args.gang_size)]
        total = len(pods)
        t = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda p: core.create_namespaced_pod(
                NS, _pod(p[0], name, p[1], args.gpus_per_pod)), pods))
        created = time.monotonic() - t
        print(f"  {total} pods created in {created:.1f}s (no scheduler yet)", file=sys.stderr)
        rate = [f"--kube-api-qps={args.qps}", f"--kube-api-burst={args.qps * 2}"]
        start = time.monotonic()
        if scheduler == "kai":
            proc = KaiRayProcess(plane.kubeconfig, Path(tempfile.mkdtemp()),
                                 ["--leader-election", "off", *rate])
            proc.start()
            if args.profile:  # sampled stacks of kai-ray run, collapsed ("raw") format
                assert proc.proc is not None
                gil = ["--gil"] if args.profile_gil else []
                spy = subprocess.Popen(["py-spy", "record", "-p", str(proc.proc.pid), "-r", "50",
                                        "--threads", *gil, "--format", "raw", "-o", args.profile],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            bins = binaries.require("kube-scheduler")
            plane.add_component("kube-scheduler", [
                str(bins["kube-scheduler"]), f"--kubeconfig={plane.kubeconfig}",
                "--leader-elect=false", "--secure-port=0", "--profiling=false", *rate])
        cpu_start = _cpu_by_process(plane, proc)
        loads: list[float] = []
        cpu_end = cpu_start
        deadline = start + args.timeout
        # bind times from a watch (kai-ray's own informer: list once, then one event per pod
        # change), not by re-listing every bound pod: lists would load the API server more the
        # longer a run lasts. A pod already bound when the list arrives counts at that moment.
        bound_at: dict[str, float] = {}
        all_bound = threading.Event()

        def on_change(kind: str, obj: dict, old: dict | None) -> None:
            name = obj["metadata"]["name"]
            if kind != "DELETED" and (obj.get("spec") or {}).get("nodeName") \
                    and name not in bound_at:
                bound_at[name] = time.monotonic()
                if len(bound_at) >= total:
                    all_bound.set()

        pods_seen = Informer("bench-pods", partial(core.list_namespaced_pod, NS), on_change,
                             watch_timeout=5)
        pods_seen.start()
        try:
            while not all_bound.wait(1.0) and time.monotonic() < deadline:
                loads.append(os.getloadavg()[0])
                cpu_end = _cpu_by_process(plane, proc)
                print(f"  {len(bound_at)}/{total} bound at {time.monotonic() - start:.1f}s",
                      file=sys.stderr)
            if all_bound.is_set():
                cpu_end = _cpu_by_process(plane, proc)
        finally:
            pods_seen.stop()
        first_bind = min(bound_at.values(), default=None)
        last_bind = max(bound_at.values(), default=None)
        bound = len(bound_at)
        e2e = (last_bind or start) - start
        cpu = {name: round(cpu_end.get(name, 0.0) - cpu_start.get(name, 0.0), 1)
               for name in cpu_end}
        bind_span = (last_bind or 0) - (first_bind or 0)
        return {"scheduler": scheduler, "pods": total, "bound": bound, "seconds": round(e2e, 1),
                "pods_per_s_e2e": round(bound / e2e, 1) if e2e else 0.0,
                "pods_per_s_bind": round(bound / bind_span, 1) if bind_span else 0.0,
                "create_seconds": round(created, 1), "qps": args.qps,
                "load_avg_mean": round(sum(loads) / len(loads), 1) if loads else None,
                "load_avg_max": round(max(loads), 1) if loads else None,
                "cpu_seconds_until_last_bind": cpu}
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        if proc is not None:
            print(f"  kai-ray log: {proc.log_path}", file=sys.stderr)
            proc.stop()
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--single", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=500)
    parser.add_argument("--gang-size", type=int, default=8)
    parser.add_argument("--gpus-per-pod", type=int, default=0,
                        help="whole GPUs per pod (default 0: the workload must fit the nodes)")
    parser.add_argument("--scheduler", choices=["kai", "kube", "both"], default="both")
    parser.add_argument("--qps", "--kube-qps", type=int, default=1000,
                        help="--kube-api-qps of both schedulers (burst: twice that; "
                             "kube-scheduler's default is 50)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--profile", help="py-spy record kai-ray run into this file "
                                          "(collapsed stacks; needs `pip install py-spy`)")
    parser.add_argument("--profile-gil", action="store_true",
                        help="sample only the thread holding the GIL (Python CPU, not waits)")
    args = parser.parse_args()
    which = ["kai", "kube"] if args.scheduler == "both" else [args.scheduler]
    results = []
    for s in which:
        print(f"== {s}", file=sys.stderr)
        results.append(run(s, args))
        print(json.dumps(results[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
