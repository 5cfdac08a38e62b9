"""Pods bound per second, end to end, on the real local control plane with KWOK nodes: kai-ray
(`kai-ray run`) against the stock kube-scheduler and the peer gang schedulers, each on the same
plane, workload and client rate limit.

    python benchmarks/bind_throughput.py --nodes 1000 --single 5000 --gangs 500 --gang-size 8
    python benchmarks/bind_throughput.py --scheduler kai-scheduler volcano   # peers (built by
                                                                            # tools/peers/build.sh)
    python benchmarks/bind_throughput.py --scheduler all --qps 50

Schedulers (kai_ray/testing/peers.py): kai (kai-ray), kube (kube-scheduler 1.34, no gangs: a
gang's pods are placed one by one), kai-scheduler (NVIDIA KAI-Scheduler: scheduler, binder, pod
grouper), volcano (vc-scheduler + vc-controller-manager's PodGroup and queue controllers),
coscheduling (scheduler-plugins' kube-scheduler with Coscheduling + its PodGroup controller),
yunikorn (k8shim; gangs as task groups, served by placeholder pods). `all` runs every one.

Each run starts a fresh plane, creates the nodes, creates every pod (16 client threads) while no
scheduler runs, gangs the way the scheduler's users make them (PodGroup + pods with its labels
and annotations), then starts the scheduler's processes: the clock starts there, so pod creation
does not limit the rate. Reported: pods bound per second from the scheduler's start to the last
pod bound (`e2e`, includes start-up: cache sync and PodGroup creation for bare pods), and from the
first bind to the last (`bind`). Every process of a scheduler gets the same client rate limit:
QPS and burst = 2*QPS (kube-scheduler's default ratio, 50/100), by each one's own flag or setting.

API requests: `apiserver_request_total` from the API server's /metrics, read right before the
scheduler starts and right after the last bind; the difference, by verb and resource, is divided
by the pods bound. The metric has no label for the client, so this counts every client: the
scheduler's processes, but also KWOK (a bound pod's status becomes Running: a PATCH of
pods/status per pod), the controller manager and this benchmark's watch (one LIST, then WATCH
requests every 5 s). `writes_per_pod` adds up create, update, patch and delete (the metric's
POST, PUT, PATCH, DELETE); `writes_per_pod_without_heartbeats` leaves out leases and nodes, which
KWOK's node heartbeats write at a steady rate, so that a slow run does not look write-heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from kubernetes import client

from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import Informer
from kai_ray.testing import apimetrics, procs
from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready
from kai_ray.testing.peers import PEERS, KaiRay, Peer, make
from kai_ray.testing.plane import ControlPlane

NS = "bench"
ALL = list(PEERS)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_process(plane: ControlPlane, peer: Peer) -> dict[str, float]:
    pids = {name: c.pid for name, c in plane.components.items()}
    pids.update(peer.pids(plane))
    out = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    out["benchmark"] = sum(os.times()[:2])
    return out


def start_plane(nodes: int, profiling: bool = False) -> tuple[ControlPlane, client.ApiClient]:
    """A fresh plane with `nodes` KWOK nodes (8 GPUs each) and the benchmark's namespace."""
    plane = ControlPlane(profiling=profiling)
    plane.start()
    try:
        api = plane.api_client()
        t = time.monotonic()
        with ThreadPoolExecutor(16) as pool:  # 1,000 creates one by one take minutes
            names = list(pool.map(lambda i: create_gpu_nodes(api, 1, 8, start=i)[0],
                                  range(nodes)))
        wait_nodes_ready(api, names, timeout=600)
        print(f"  {nodes} nodes ready in {time.monotonic() - t:.1f}s", file=sys.stderr)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        plane.wait_service_account(NS)
    except BaseException:
        plane.stop()
        raise
    return plane, api


def workload(peer: Peer, single: int, gangs: int, gang_size: int, gpus: int
             ) -> tuple[list[tuple[str, int]], list[dict]]:
    """The gangs' group objects (name, size) and every pod, built the peer's way."""
    pods = [peer.pod(f"single-{i}", None, 1, gpus) for i in range(single)]
    groups = []
    for g in range(gangs):
        name = f"gang-{g}"
        if peer.gangs:
            groups.append((name, gang_size))
            pods += [peer.pod(f"{name}-{k}", name, gang_size, gpus) for k in range(gang_size)]
        else:
            pods += [peer.pod(f"{name}-{k}", None, 1, gpus) for k in range(gang_size)]
    return groups, pods


def create_all(api: client.ApiClient, peer: Peer, groups: list[tuple[str, int]],
               pods: list[dict]) -> float:
    """Create the groups, then the pods (16 threads); returns the seconds it took."""
    core = client.CoreV1Api(api)
    t = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda g: peer.create_group(api, NS, *g), groups))
        list(pool.map(lambda p: core.create_namespaced_pod(NS, p), pods))
    return time.monotonic() - t


class BindWatch:
    """Bind times of the named pods from a watch (an Informer: one list, then one event per
    change), not by re-listing bound pods, which would load the API server more the longer a
    run lasts. A pod already bound when the list arrives counts at that moment. Pods the
    scheduler creates itself (YuniKorn's placeholders) are not among the names."""

    def __init__(self, api: client.ApiClient, names: set[str]) -> None:
        self.names = names
        self.bound_at: dict[str, float] = {}
        self.all_bound = threading.Event()
        self.first = threading.Event()
        self.informer = Informer("bench-pods", partial(client.CoreV1Api(api).list_namespaced_pod,
                                                       NS), self._on_change, watch_timeout=5)

    def _on_change(self, kind: str, obj: dict, old: dict | None) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and name in self.names and name not in self.bound_at \
                and (obj.get("spec") or {}).get("nodeName"):
            self.bound_at[name] = time.monotonic()
            self.first.set()
            if len(self.bound_at) >= len(self.names):
                self.all_bound.set()

    def __enter__(self) -> BindWatch:
        self.informer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.informer.stop()


def check_alive(plane: ControlPlane, peer: Peer) -> None:
    """Fail fast when one of the scheduler's processes died (with the end of its log)."""
    for name, comp in plane.components.items():
        if name in peer.components and not comp.alive():
            raise RuntimeError(f"{name} exited; end of {comp.log}:\n{procs.tail(comp.log)}")
    if isinstance(peer, KaiRay) and peer.proc is not None and peer.proc.proc is not None \
            and not peer.proc.alive():
        raise RuntimeError(f"kai-ray exited:\n{peer.proc.log_tail()}")


#: what KWOK's node heartbeats write (Lease renewals, node status): no scheduler writes these,
#: and their number grows with the run's length, not with the pods
HEARTBEATS = ("leases", "nodes")


def requests_per_pod(diff: dict[apimetrics.Key, int], bound: int) -> dict[str, float]:
    """'VERB resource[/subresource]' -> requests per bound pod, largest first (under 0.001
    left out)."""
    out = {f"{verb} {res}{'/' + sub if sub else ''}": n / bound
           for (verb, res, sub), n in diff.items()}
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])
            if round(v, 3)}


def writes_per_pod(diff: dict[apimetrics.Key, int], bound: int) -> dict[str, float | None]:
    """All writes per bound pod, and those without KWOK's node heartbeats."""
    if not bound:
        return {"writes_per_pod": None, "writes_per_pod_without_heartbeats": None}
    pods_only = {k: n for k, n in diff.items() if k[1] not in HEARTBEATS}
    return {"writes_per_pod": round(apimetrics.writes(diff) / bound, 3),
            "writes_per_pod_without_heartbeats": round(apimetrics.writes(pods_only) / bound, 3)}


def _apiserver_profile(api: client.ApiClient, path: Path, seconds: int) -> None:
    data = rawapi.get_bytes(api, f"/debug/pprof/profile?seconds={seconds}",
                            timeout=(5, seconds + 30))
    path.write_bytes(data)
    print(f"  API server CPU profile ({seconds}s): {path}", file=sys.stderr)


def run(key: str, args: argparse.Namespace) -> dict:
    peer = make(key)
    plane, api = start_plane(args.nodes, profiling=bool(args.apiserver_profile))
    spy: subprocess.Popen[bytes] | None = None
    try:
        peer.install(plane, NS)
        groups, pods = workload(peer, args.single, args.gangs, args.gang_size, args.gpus_per_pod)
        total = len(pods)
        created = create_all(api, peer, groups, pods)
        print(f"  {total} pods created in {created:.1f}s (no scheduler yet)", file=sys.stderr)
        names = {p["metadata"]["name"] for p in pods}
        with BindWatch(api, names) as watch:
            watch.informer.synced.wait(60)
            requests_before = apimetrics.request_totals(api)
            serving_before = apimetrics.serving_seconds(api)
            watch_before = apimetrics.watch_events(api)
            start = time.monotonic()
            peer.start(plane, args.qps, args.qps * 2)
            if args.profile and isinstance(peer, KaiRay):
                # sampled stacks of kai-ray run, collapsed ("raw") format
                assert peer.proc is not None and peer.proc.proc is not None
                gil = ["--gil"] if args.profile_gil else []
                # --nonblocking: pausing 150 threads 50 times a second slowed the run 3x
                spy = subprocess.Popen(["py-spy", "record", "-p", str(peer.proc.proc.pid), "-r",
                                        "50", "--nonblocking", "--threads", *gil, "--format",
                                        "raw", "-o", args.profile],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            apiserver_pprof = None
            if args.apiserver_profile:
                # the API server's own CPU profile over the run's first seconds (its pprof
                # endpoint, on by default): `go tool pprof -top FILE` says where its time goes
                where = Path(args.apiserver_profile)
                where = where.with_name(f"{where.stem}-{key}{where.suffix}")
                apiserver_pprof = threading.Thread(target=_apiserver_profile, args=(
                    api, where, args.apiserver_profile_s), daemon=True)
                apiserver_pprof.start()
            cpu_start = _cpu_by_process(plane, peer)
            loads: list[float] = []
            cpu_end = cpu_start
            deadline = start + args.timeout
            stalled = False
            while not watch.all_bound.wait(1.0) and time.monotonic() < deadline:
                last = max(watch.bound_at.values(), default=start)
                if time.monotonic() - last > args.stall_timeout:
                    stalled = True  # a scheduler that gave up on pods (YuniKorn, after a
                    break           # Binding timed out) would otherwise hold the run to --timeout
                loads.append(os.getloadavg()[0])
                cpu_end = _cpu_by_process(plane, peer)
                check_alive(plane, peer)
                print(f"  {len(watch.bound_at)}/{total} bound at {time.monotonic() - start:.1f}s",
                      file=sys.stderr)
            if watch.all_bound.is_set():
                cpu_end = _cpu_by_process(plane, peer)
            if apiserver_pprof is not None:
                apiserver_pprof.join(args.apiserver_profile_s + 30)
            requests_after = apimetrics.request_totals(api)
            serving = apimetrics.difference(apimetrics.serving_seconds(api), serving_before)
            watched = apimetrics.difference(apimetrics.watch_events(api), watch_before)
        bound_at = watch.bound_at
        first_bind = min(bound_at.values(), default=None)
        last_bind = max(bound_at.values(), default=None)
        bound = len(bound_at)
        e2e = (last_bind or start) - start
        cpu = {name: round(cpu_end.get(name, 0.0) - cpu_start.get(name, 0.0), 1)
               for name in cpu_end}
        bind_span = (last_bind or 0) - (first_bind or 0)
        diff = apimetrics.difference(requests_after, requests_before)
        return {"scheduler": key, "pods": total, "bound": bound, "stalled": stalled,
                "seconds": round(e2e, 1),
                "pods_per_s_e2e": round(bound / e2e, 1) if e2e else 0.0,
                "pods_per_s_bind": round(bound / bind_span, 1) if bind_span else 0.0,
                "first_bind_s": round(first_bind - start, 2) if first_bind else None,
                "create_seconds": round(created, 1), "qps": args.qps,
                "load_avg_mean": round(sum(loads) / len(loads), 1) if loads else None,
                "load_avg_max": round(max(loads), 1) if loads else None,
                "cpu_seconds_until_last_bind": cpu,
                **writes_per_pod(diff, bound),
                "requests_per_pod": requests_per_pod(diff, bound) if bound else {},
                # where the API server's time went: seconds serving each kind of request
                # (the largest 8), and watch events sent per pod by kind
                "apiserver_serving_s": {
                    f"{verb} {res}{'/' + sub if sub else ''}": round(v, 1)
                    for (verb, res, sub), v in sorted(serving.items(), key=lambda kv: -kv[1])[:8]},
                "watch_events_per_pod": {
                    kind: round(n / bound, 2) for kind, n in sorted(
                        watched.items(), key=lambda kv: -kv[1])
                    if bound and not kind.endswith(" bytes") and n / bound >= 0.01},
                "watch_kib_per_pod": round(sum(n for k, n in watched.items()
                                               if k.endswith(" bytes")) / 1024 / bound, 1)
                if bound else None}
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        stop_run(plane, peer, args)


def stop_run(plane: ControlPlane, peer: Peer, args: argparse.Namespace) -> None:
    """The scheduler's processes, then the plane (kept on disk with --keep-logs); where the
    scheduler's logs are is printed first."""
    for name, log in peer.logs(plane).items():
        print(f"  {name} log: {log}", file=sys.stderr)
        if name == "kai-ray" and log.exists():  # which core it ran: set by PYTHONPATH
            said = [line.split("scheduling core: ", 1)[1].strip()
                    for line in log.read_text(errors="replace").splitlines()
                    if "scheduling core: " in line]
            print(f"  kai-ray core: {said[0] if said else 'not logged'}", file=sys.stderr)
    peer.stop(plane)
    if args.keep_logs:
        plane.keep_workdir = True
    plane.stop()


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gang-size", type=int, default=8)
    parser.add_argument("--gpus-per-pod", type=int, default=0,
                        help="whole GPUs per pod (default 0: the workload must fit the nodes)")
    parser.add_argument("--scheduler", nargs="+", default=["kai", "kube"],
                        choices=[*ALL, "all", "both"],
                        help="one or more of these; all: every one; both: kai and kube "
                             "(the default)")
    parser.add_argument("--qps", "--kube-qps", type=int, default=1000,
                        help="client QPS of every scheduler process (burst: twice that; "
                             "kube-scheduler's default is 50)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--stall-timeout", type=float, default=180,
                        help="end a run when no pod was bound for this long (reported as "
                             "stalled)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep each plane's directory (the schedulers' logs)")


def schedulers(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for s in args.scheduler:
        for k in ALL if s == "all" else ["kai", "kube"] if s == "both" else [s]:
            if k not in out:
                out.append(k)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--single", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=500)
    parser.add_argument("--profile", help="py-spy record kai-ray run into this file "
                                          "(collapsed stacks; needs `pip install py-spy`)")
    parser.add_argument("--apiserver-profile", metavar="FILE",
                        help="write kube-apiserver's CPU profile (pprof) over the first "
                        "--apiserver-profile-s seconds after the scheduler starts, one file "
                        "per scheduler (FILE's name + -SCHEDULER)")
    parser.add_argument("--apiserver-profile-s", type=int, default=20)
    parser.add_argument("--profile-gil", action="store_true",
                        help="sample only the thread holding the GIL (Python CPU, not waits)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the schedulers this many times, taking turns (kai, kube, kai, "
                        "kube, ...), and end with each one's median: single runs of the same "
                        "code vary by about 15 %% on the 2-core machine")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for s in schedulers(args):
            print(f"== {s}" + (f" (round {r + 1}/{args.rounds})" if args.rounds > 1 else ""),
                  file=sys.stderr)
            result = run(s, args)
            results.setdefault(s, []).append(result)
            print(json.dumps(result), flush=True)
    if args.rounds > 1:
        for s, runs in results.items():
            print(json.dumps(median_of(s, runs)), flush=True)
    return 0


def median_of(scheduler: str, runs: list[dict]) -> dict:
    """The median of each rate over `runs`, with every run's value beside it."""
    out: dict = {"scheduler": scheduler, "median_of_runs": len(runs)}
    for key in ("pods_per_s_e2e", "pods_per_s_bind", "first_bind_s", "seconds"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
        out[f"{key}_runs"] = values
    return out


if __name__ == "__main__":
    sys.exit(main())
