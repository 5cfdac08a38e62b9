"""Pods bound per second, end to end, on the real local control plane with KWOK nodes:
kai-ray (`kai-ray run`) against the stock kube-scheduler on the same plane and workload.

    python benchmarks/bind_throughput.py --nodes 1000 --single 5000 --gangs 500 --gang-size 8
    python benchmarks/bind_throughput.py --scheduler kube --kube-qps 50   # kube's default QPS

Each run starts a fresh plane, creates the nodes, creates every pod (16 client threads) while no
scheduler runs, then starts the scheduler: the clock starts there, so pod creation does not limit
the rate. Reported: pods bound per second from the scheduler's start to the last pod bound
(`e2e`, includes kai-ray's start-up: cache sync and PodGroup creation for the bare pods), and from
the first bind to the last (`bind`). kai-ray's pods are in a queue
and gangs are PodGroups (min = gang size); kube-scheduler gets the same pods one by one (it has
no gangs). kai-ray's client has no rate limiter; its binder binds up to 8 gangs at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

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


def run(scheduler: str, args: argparse.Namespace) -> dict:
    plane = ControlPlane()
    plane.start()
    proc = None
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
        start = time.monotonic()
        if scheduler == "kai":
            proc = KaiRayProcess(plane.kubeconfig, Path(tempfile.mkdtemp()),
                                 ["--leader-election", "off"])
            proc.start()
        else:
            bins = binaries.require("kube-scheduler")
            plane.add_component("kube-scheduler", [
                str(bins["kube-scheduler"]), f"--kubeconfig={plane.kubeconfig}",
                "--leader-elect=false", "--secure-port=0", "--profiling=false",
                f"--kube-api-qps={args.kube_qps}", f"--kube-api-burst={args.kube_qps * 2}"])
        first_bind = last_bind = None
        bound = 0
        deadline = start + args.timeout
        while time.monotonic() < deadline:
            resp = core.list_namespaced_pod(NS, field_selector="spec.nodeName!=",
                                            _preload_content=False)
            now = time.monotonic()
            count = len(json.loads(resp.data)["items"])
            if count and first_bind is None:
                first_bind = now
            if count > bound:
                last_bind, bound = now, count
                print(f"  {bound}/{total} bound at {now - start:.1f}s", file=sys.stderr)
            if bound >= total:
                break
            time.sleep(0.5)
        e2e = (last_bind or start) - start
        bind_span = (last_bind or 0) - (first_bind or 0)
        return {"scheduler": scheduler, "pods": total, "bound": bound, "seconds": round(e2e, 1),
                "pods_per_s_e2e": round(bound / e2e, 1) if e2e else 0.0,
                "pods_per_s_bind": round(bound / bind_span, 1) if bind_span else 0.0,
                "create_seconds": round(created, 1)}
    finally:
        if proc is not None:
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
    parser.add_argument("--kube-qps", type=int, default=1000,
                        help="kube-scheduler's --kube-api-qps (its default is 50)")
    parser.add_argument("--timeout", type=float, default=1800)
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
