"""Memory of the scheduler while nothing fits (not a test: a measurement). On a fresh local
control plane, --pods kai-scheduler pods in PodGroups of --gang-size that can never be placed
(each asks for more GPUs than a node has), then --minutes of scheduling cycles, sampling:

- the scheduler's RSS (VmRSS): flat from the first cycle to the end, not growing per cycle;
- its event queue length and the event recorder's counters (written, dropped, ...);
- Events per pod in the API (every Event listed every --census-every seconds): bounded, one
  per (pod, reason, message), its `count` growing once per repeat interval.

    python benchmarks/pending_memory.py --pods 2000 --minutes 1     # a quick look
    python benchmarks/pending_memory.py                             # 50,000 pods, 10 minutes
    python benchmarks/pending_memory.py --pods 2000 --no-trim       # the watch cache untrimmed

The scheduler runs as a child process built as `kai-ray run` builds it (watch cache, pod
grouper, scheduler loop, status and event writers); it reports its event recorder's numbers,
which `kai-ray run` exposes only to itself. Its API client has --qps (default 1000), so the
first cycle's 50,000 PodScheduled conditions take a minute, not the 17 the default 50/s would
hold that cycle for; its events client has --events-qps (default 50, kube-scheduler's), the
rate the event queue drains at. The pods look like KubeRay workers (env, probes, volumes,
mounts), as the API server stores them (managedFields): what the watch cache trims.

Output: a table on stdout, and JSON (every sample) in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kubernetes import client

from kai_ray.api_names import PODGROUP
from kai_ray.k8s import rawapi
from kai_ray.k8s.client import api_client
from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready
from kai_ray.testing.plane import ControlPlane

NS = "bench"
QUEUE = "bench"
GPUS_PER_NODE = 8
RESULTS = Path(__file__).parent / "results"


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- the child
def _rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process in KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def child(args: argparse.Namespace) -> int:
    """The scheduler, as `kai-ray run` builds it, writing one JSON line of its numbers to
    --stats every --every seconds until SIGTERM."""
    import logging

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kai_ray.controller.main import load_config
    from kai_ray.controller.podgrouper import PodGrouper
    from kai_ray.controller.scheduler_loop import SchedulerLoop
    from kai_ray.k8s import trim
    from kai_ray.k8s.cache import ClusterCache

    if args.no_trim:
        for name in ("trim_pod", "trim_node", "trim_podgroup", "trim_queue",
                     "trim_priority_class"):
            setattr(trim, name, lambda obj: obj)
    api = api_client(args.child, qps=args.qps, burst=2 * args.qps)
    events_api = api_client(args.child, pool_size=8, qps=args.events_qps,
                            burst=2 * args.events_qps)
    t0 = time.monotonic()
    cache = ClusterCache(api)
    cache.start(timeout=900)
    synced = time.monotonic() - t0
    loop = SchedulerLoop(api, cache, load_config(None), grouper=None, events_api=events_api)
    loop.events.repeat_interval = args.repeat_interval
    loop.grouper = PodGrouper(api, cache, loop.events, workers=16)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=loop.run, name="scheduler-loop", daemon=True).start()
    with open(args.stats, "a") as out:
        while True:
            result = loop.last_result
            line = {"t": round(time.monotonic() - t0, 1), "synced_s": round(synced, 1),
                    "rss_kib": _rss_kib(), "cycles": loop.cycles,
                    "cycle_s": round(result.action_seconds.get("cycle", 0.0), 2)
                    if result else None,
                    "pending_jobs": len(result.job_status) if result else None,
                    "cached_pods": len(cache.pods.items), **loop.events.stats()}
            out.write(json.dumps(line) + "\n")
            out.flush()
            if stop.wait(args.every):
                break
    loop.stop()
    return 0


# ----------------------------------------------------------------------------------- the parent
def _pod(i: int, group: str) -> dict[str, Any]:
    """A KubeRay-like worker asking for twice the GPUs of any node."""
    env = [{"name": f"RAY_SETTING_{k}", "value": f"value-{k}-" + "x" * 24} for k in range(12)]
    env += [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CPU_REQUEST", "valueFrom": {"resourceFieldRef": {
                "containerName": "ray-worker", "resource": "requests.cpu"}}}]
    probe = {"exec": {"command": ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/api/"
                                  "local_raylet_healthz | grep success"]},
             "initialDelaySeconds": 30, "periodSeconds": 5, "timeoutSeconds": 2,
             "failureThreshold": 120}
    gpus = str(2 * GPUS_PER_NODE)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"worker-{i:06d}", "namespace": NS,
        "labels": {"kai.scheduler/queue": QUEUE, "ray.io/cluster": group,
                   "ray.io/group": "gpu-group", "ray.io/node-type": "worker",
                   "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "bench"},
        "annotations": {"pod-group-name": group}},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{
                "name": "ray-worker", "image": "rayproject/ray-ml:2.46.0-py310-gpu",
                "command": ["/bin/bash", "-lc", "--"],
                "args": ["ulimit -n 65536; ray start --address=$RAY_IP:6379 --block"],
                "env": env, "ports": [{"containerPort": 8080, "name": "metrics"}],
                "resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": gpus},
                              "requests": {"cpu": "8", "memory": "32Gi",
                                           "nvidia.com/gpu": gpus}},
                "volumeMounts": [{"mountPath": "/dev/shm", "name": "shared-mem"},
                                 {"mountPath": "/data", "name": "data"}],
                "livenessProbe": probe, "readinessProbe": probe}],
            "volumes": [{"name": "shared-mem", "emptyDir": {"medium": "Memory"}},
                        {"name": "data", "emptyDir": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}]}}


def _parallel(what: str, fn: Any, items: list[Any], threads: int = 16) -> None:
    t = time.monotonic()
    done = 0
    step = max(1, len(items) // 10)
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(fn, items):
            done += 1
            if done % step == 0 or done == len(items):
                rate = done / max(1e-9, time.monotonic() - t)
                _log(f"  {what}: {done}/{len(items)} ({rate:.0f}/s)")


def _event_census(api: client.ApiClient, pods: int) -> dict[str, Any]:
    """Every Event in the namespace, counted per pod (one list, paged: a field selector per
    pod makes the API server scan every Event each time)."""
    core = client.CoreV1Api(api)
    per_pod: dict[str, int] = {}
    count_max = other = 0
    token = None
    while True:
        kw = {"limit": 2000, **({"_continue": token} if token else {})}
        page = json.loads(core.list_namespaced_event(NS, _preload_content=False, **kw).data)
        for e in page.get("items") or []:
            involved = e.get("involvedObject") or {}
            if involved.get("kind") != "Pod":
                other += 1
                continue
            per_pod[involved.get("name", "")] = per_pod.get(involved.get("name", ""), 0) + 1
            count_max = max(count_max, int(e.get("count") or 1))
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
    return {"pod_events": sum(per_pod.values()), "other_events": other,
            "pods_with_events": len(per_pod), "pods_without": pods - len(per_pod),
            "events_per_pod_max": max(per_pod.values(), default=0),
            "count_max": count_max}


def run(args: argparse.Namespace) -> dict[str, Any]:
    plane = ControlPlane()
    plane.start()
    proc: subprocess.Popen[bytes] | None = None
    workdir = Path(tempfile.mkdtemp(prefix="pending-memory-"))
    try:
        api = api_client(str(plane.kubeconfig), pool_size=32)
        core = client.CoreV1Api(api)
        nodes = [f"kwok-gpu-{i}" for i in range(args.nodes)]
        _parallel("nodes", lambda i: create_gpu_nodes(api, 1, GPUS_PER_NODE, start=i),
                  list(range(args.nodes)))
        wait_nodes_ready(api, nodes, timeout=600)
        core.create_namespace({"metadata": {"name": NS}})
        plane.wait_service_account(NS)
        unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "scheduling.run.ai", "v2", "queues", {
                "apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                "metadata": {"name": QUEUE},
                "spec": {"resources": {"gpu": unlimited, "cpu": unlimited,
                                       "memory": unlimited}}})
        groups = math.ceil(args.pods / args.gang_size)

        def podgroup(g: int) -> None:
            size = min(args.gang_size, args.pods - g * args.gang_size)
            rawapi.create_custom(api, PODGROUP, NS, {
                "apiVersion": PODGROUP.api_version, "kind": PODGROUP.kind,
                "metadata": {"name": f"gang-{g:05d}", "namespace": NS},
                "spec": {"queue": QUEUE, "minMember": size}})

        _parallel("PodGroups", podgroup, list(range(groups)))
        t = time.monotonic()
        _parallel("pods", lambda i: rawapi.request(
            api, "POST", f"/api/v1/namespaces/{NS}/pods",
            _pod(i, f"gang-{i // args.gang_size:05d}")), list(range(args.pods)))
        created = time.monotonic() - t
        stored = json.loads(core.read_namespaced_pod("worker-000000", NS,
                                                     _preload_content=False).data)
        stats = workdir / "stats.jsonl"
        argv = [sys.executable, __file__, "--child", str(plane.kubeconfig), "--stats",
                str(stats), "--qps", str(args.qps), "--events-qps", str(args.events_qps),
                "--repeat-interval", str(args.repeat_interval), "--every", str(args.every),
                *(["--no-trim"] if args.no_trim else []),
                *(["--paged-list"] if args.paged_list else [])]
        log_path = workdir / "scheduler.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        _log(f"  scheduler pid {proc.pid}, log {log_path}")
        samples: list[dict[str, Any]] = []
        event_samples: list[dict[str, Any]] = []
        start = None
        next_events = 0.0
        while True:
            time.sleep(args.every)
            if proc.poll() is not None:
                raise RuntimeError(f"the scheduler exited:\n{log_path.read_text()[-3000:]}")
            lines = stats.read_text().splitlines() if stats.exists() else []
            if not lines:
                _log("  scheduler: listing the cluster")
                continue
            last = json.loads(lines[-1])
            if last["cycles"] and start is None:
                start = time.monotonic()  # --minutes count from the first cycle
            if start is None:
                _log(f"  scheduler: synced in {last['synced_s']}s, first cycle running "
                     f"(RSS {last['rss_kib'] / 1024:.0f} MiB)")
                continue
            elapsed = time.monotonic() - start
            last["elapsed_s"] = round(elapsed, 1)
            samples.append(last)
            if elapsed >= next_events or elapsed >= args.minutes * 60:
                ev = _event_census(api, args.pods)
                ev["elapsed_s"] = round(elapsed, 1)
                event_samples.append(ev)
                next_events = elapsed + args.census_every
            _log(f"  {elapsed:6.0f}s: cycles {last['cycles']} ({last['cycle_s']}s), RSS "
                 f"{last['rss_kib'] / 1024:.0f} MiB, event queue {last['queued']}, written "
                 f"{last['written']} (updates {last['aggregated']}), dropped {last['dropped']}, "
                 f"Events per pod <= {event_samples[-1]['events_per_pod_max']}")
            if elapsed >= args.minutes * 60:
                break
        first, end = samples[0], samples[-1]
        queue_max = max(s["queued"] for s in samples)
        return {
            "pods": args.pods, "gang_size": args.gang_size, "podgroups": groups,
            "nodes": args.nodes, "minutes": args.minutes, "qps": args.qps,
            "events_qps": args.events_qps, "repeat_interval_s": args.repeat_interval,
            "trimmed": not args.no_trim, "paged_list": args.paged_list,
            "create_seconds": round(created, 1),
            "pod_json_bytes_stored": len(json.dumps(stored, separators=(",", ":"))),
            "cache_synced_s": first["synced_s"], "cycles": end["cycles"] - first["cycles"],
            "cycle_s_last": end["cycle_s"],
            "rss_mib_start": round(first["rss_kib"] / 1024, 1),
            "rss_mib_end": round(end["rss_kib"] / 1024, 1),
            "rss_mib_max": round(max(s["rss_kib"] for s in samples) / 1024, 1),
            "event_queue_max": queue_max, "event_queue_end": end["queued"],
            "events": {k: end[k] for k in ("written", "aggregated", "suppressed", "dropped",
                                           "failed", "forgotten", "remembered")},
            "events_in_api": event_samples[-1], "samples": samples,
            "event_samples": event_samples}
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        plane.stop()


def table(r: dict[str, Any]) -> str:
    e, ev = r["events"], r["events_in_api"]
    rows = [
        ("pods pending (PodGroups)", f"{r['pods']} ({r['podgroups']})"),
        ("pod as stored (JSON bytes)", r["pod_json_bytes_stored"]),
        ("watch cache trimmed / listed in pages", f"{r['trimmed']} / {r['paged_list']}"),
        ("cycles in the window", f"{r['cycles']} (last {r['cycle_s_last']}s)"),
        ("RSS first cycle -> end (max)",
         f"{r['rss_mib_start']} -> {r['rss_mib_end']} MiB ({r['rss_mib_max']})"),
        ("event queue max / end", f"{r['event_queue_max']} / {r['event_queue_end']}"),
        ("events written (updates)", f"{e['written']} ({e['aggregated']})"),
        ("repeats not written", e["suppressed"]),
        ("dropped (queue full) / failed", f"{e['dropped']} / {e['failed']}"),
        ("keys remembered (forgotten)", f"{e['remembered']} ({e['forgotten']})"),
        ("Events in the API: pods' / others'", f"{ev['pod_events']} / {ev['other_events']}"),
        ("Events per pod",
         f"max {ev['events_per_pod_max']} (count max {ev['count_max']}); pods with none yet "
         f"{ev['pods_without']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="of cycles, from the end of the first one")
    parser.add_argument("--gang-size", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--qps", type=int, default=1000, help="the scheduler's API client")
    parser.add_argument("--events-qps", type=int, default=50,
                        help="the scheduler's events client (kube-scheduler's default: 50)")
    parser.add_argument("--repeat-interval", type=float, default=600.0,
                        help="seconds between updates of a repeated Event (the default's)")
    parser.add_argument("--census-every", type=float, default=120.0,
                        help="seconds between counts of the Events in the API")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--no-trim", action="store_true",
                        help="keep whole objects in the watch cache (for comparison)")
    parser.add_argument("--paged-list", action="store_true",
                        help="recorded in the results only: the watch cache lists in pages "
                             "itself now (kai_ray.k8s.cache.LIST_PAGE); kept so the recorded "
                             "runs' command still works")
    parser.add_argument("-o", "--output", help="JSON file (default: benchmarks/results/"
                                               "pending_memory_<pods>[_untrimmed].json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # kubeconfig: run the scheduler
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    result = run(args)
    print(table(result))
    out = Path(args.output) if args.output else RESULTS / (
        f"pending_memory_{args.pods}{'_untrimmed' if args.no_trim else ''}"
        f"{'_paged' if args.paged_list else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    _log(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
